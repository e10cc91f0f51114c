package fakebank

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Bank is a fake payment provider that applies each idempotency key at most once (or, in strict
// mode, every request it receives: see Config.Strict), misbehaves on request, and keeps its own
// ledger and request log as the evidence a test checks. It is safe for concurrent use.
type Bank struct {
	cfg     *Config
	handler http.Handler

	// mu guards the ledger and the fault programme. It is never held across I/O.
	mu        sync.Mutex
	rng       *rand.Rand
	mix       Mix
	next      []Fault
	keyFaults map[string][]Fault
	payments  map[string]*Payment // the first payment applied under each key: what a lookup finds
	order     []*Payment          // every payment applied, in order (strict mode: several per key)
	requests  []*Request          // every POST /payments that reached the bank, in arrival order
	effects   map[string]int      // counted separately from payments so a double apply would show
	refs      map[string][]string
	seq       int
	stats     Stats

	// life guards the listener's lifecycle.
	life     sync.Mutex
	started  bool
	down     bool
	closed   bool
	closing  chan struct{} // closed by Close: wakes handlers sleeping in Delay or Latency
	inflight sync.WaitGroup
	addr     string // the address actually bound, reused by SetDown(false)
	srv      *http.Server
	cancel   context.CancelFunc // cancels the serving generation's request contexts
	served   chan struct{}
}

// New returns a bank that is not yet listening: call Start, or mount Handler in a server of your
// own. A nil cfg uses the defaults. New panics on an invalid config (a negative duration, a bad
// fault mix), as that is a bug in the test; check a Mix from user input with Mix.Validate first.
func New(cfg *Config) *Bank {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	b := &Bank{
		cfg:       cfg,
		rng:       rand.New(rand.NewPCG(cfg.Seed, 0)),
		mix:       cfg.Faults,
		keyFaults: make(map[string][]Fault),
		payments:  make(map[string]*Payment),
		effects:   make(map[string]int),
		refs:      make(map[string][]string),
		stats:     Stats{Faults: make(map[Fault]int)},
		closing:   make(chan struct{}),
	}
	b.handler = b.newHandler()
	return b
}

// Start listens on Config.Addr and serves in the background until Close.
func (b *Bank) Start() error {
	b.life.Lock()
	defer b.life.Unlock()
	switch {
	case b.closed:
		return errors.New("fakebank: start: bank is closed")
	case b.started:
		return fmt.Errorf("fakebank: start: already listening on %s", b.addr)
	}
	host, _, err := net.SplitHostPort(b.cfg.Addr)
	if err != nil {
		return fmt.Errorf("fakebank: start: address %q: %w", b.cfg.Addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("fakebank: start: address %q is not loopback; the bank has no authentication, use 127.0.0.1", b.cfg.Addr)
	}
	ln, err := net.Listen("tcp", b.cfg.Addr)
	if err != nil {
		return fmt.Errorf("fakebank: start: %w", err)
	}
	b.addr = ln.Addr().String()
	b.started = true
	b.serveLocked(ln)
	return nil
}

// URL returns the bank's base URL, such as "http://127.0.0.1:41234", or "" before Start. It
// does not change across SetDown.
func (b *Bank) URL() string {
	b.life.Lock()
	defer b.life.Unlock()
	if b.addr == "" {
		return ""
	}
	return "http://" + b.addr
}

// Handler returns the bank's HTTP API, for mounting in a server of your own (httptest, say).
// SetDown only affects the listener Start opened.
func (b *Bank) Handler() http.Handler { return b.handler }

// SetDown takes the bank off the network (true) or back on (false). While down its port is
// closed, so a client's dial is refused: that attempt never reached the bank (an earlier one
// on a kept-alive connection may have; see IsNotProcessed). Going down also cuts open connections, so requests in flight end ambiguous,
// as they would in a real outage. Coming back listens on the same port, so clients need no new
// URL; it fails only if something else took the port meanwhile.
func (b *Bank) SetDown(down bool) error {
	b.life.Lock()
	defer b.life.Unlock()
	switch {
	case b.closed:
		return errors.New("fakebank: set down: bank is closed")
	case !b.started:
		return errors.New("fakebank: set down: bank is not started")
	case down == b.down:
		return nil
	}
	if down {
		b.down = true
		return b.stopServingLocked()
	}
	ln, err := net.Listen("tcp", b.addr)
	if err != nil {
		return fmt.Errorf("fakebank: set down: listening again on %s: %w", b.addr, err)
	}
	b.down = false
	b.serveLocked(ln)
	return nil
}

// Close stops the listener, cuts open connections and waits for handlers to return. Handlers
// holding an answer back (DelayAfterApply, Latency) give up at once. Close is idempotent.
func (b *Bank) Close() error {
	b.life.Lock()
	if b.closed {
		b.life.Unlock()
		return nil
	}
	b.closed = true
	close(b.closing)
	var err error
	if b.started && !b.down {
		err = b.stopServingLocked()
	}
	b.life.Unlock()
	b.inflight.Wait()
	return err
}

func (b *Bank) serveLocked(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	srv := &http.Server{
		Handler:           b.handler,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		// Serve only returns ErrServerClosed here: stopServingLocked is the only way out.
		_ = srv.Serve(ln)
	}()
	b.srv, b.cancel, b.served = srv, cancel, served
}

func (b *Bank) stopServingLocked() error {
	b.cancel()
	err := b.srv.Close()
	<-b.served
	b.srv, b.cancel, b.served = nil, nil, nil
	if err != nil {
		return fmt.Errorf("fakebank: closing listener: %w", err)
	}
	return nil
}

// enter admits a request unless the bank is closed, so that Close can wait for every handler.
func (b *Bank) enter() bool {
	b.life.Lock()
	defer b.life.Unlock()
	if b.closed {
		return false
	}
	b.inflight.Add(1)
	return true
}

// sleep waits d, or less if the request or the bank goes away; it reports whether d elapsed.
func (b *Bank) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-b.closing:
		return false
	}
}

// SetFaults replaces the random fault mix. Programmed faults (FailNext, FailKey) still come first.
func (b *Bank) SetFaults(m Mix) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("fakebank: set faults: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mix = m
	return nil
}

// FailNext makes the next n POST /payments requests meet fault f instead of a random draw.
// Calls queue up in order. Requests whose key has a FailKey fault, and malformed requests, do not
// use up the n. FailNext(n, NoFault) shields n requests from the mix.
func (b *Bank) FailNext(n int, f Fault) {
	if !f.valid() {
		panic(fmt.Sprintf("fakebank: FailNext: unknown fault %d", int(f)))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		b.next = append(b.next, f)
	}
}

// FailKey makes the next POST /payments request under key meet fault f, once. Calls for the same
// key queue up. It takes precedence over FailNext and the mix.
func (b *Bank) FailKey(key string, f Fault) {
	if !f.valid() {
		panic(fmt.Sprintf("fakebank: FailKey: unknown fault %d", int(f)))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keyFaults[key] = append(b.keyFaults[key], f)
}

// Effects returns how many times the bank applied key: 0 or 1 in the default mode, whatever the
// faults; in strict mode, one per request that got as far as being applied. A declined payment counts: the bank recorded a decision under the key, and a second
// decision would be just as wrong as a second payout.
func (b *Bank) Effects(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.effects[key]
}

// Applied returns every payment the bank applied, declined ones included, in the order applied.
func (b *Bank) Applied() []Payment {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.appliedLocked()
}

func (b *Bank) appliedLocked() []Payment {
	out := make([]Payment, 0, len(b.order))
	for _, p := range b.order {
		out = append(out, *p)
	}
	return out
}

// DuplicateReferences returns the references paid (succeeded) under more than one key. A system
// that resends under a new key after an ambiguous failure shows up here even though each key was
// applied once.
func (b *Bank) DuplicateReferences() map[string][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return duplicates(b.refs)
}

// Stats returns a copy of the bank's counters.
func (b *Bank) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statsLocked()
}

func (b *Bank) statsLocked() Stats {
	s := b.stats
	s.Faults = maps.Clone(b.stats.Faults)
	return s
}

// Ledger returns a snapshot of the ledger, the same one GET /admin/ledger serves.
func (b *Bank) Ledger() *Ledger {
	b.mu.Lock()
	defer b.mu.Unlock()
	refs := make(map[string][]string, len(b.refs))
	for ref, keys := range b.refs {
		refs[ref] = slices.Clone(keys)
	}
	return &Ledger{Payments: b.appliedLocked(), References: refs, Stats: b.statsLocked()}
}

// Statement returns the succeeded payments q selects, in the order applied.
func (b *Bank) Statement(q StatementQuery) []Payment {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := []Payment{}
	for _, p := range b.order {
		if q.match(p) {
			out = append(out, *p)
		}
	}
	return out
}

func (b *Bank) countRequest() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stats.Requests++
}

// takeFault decides the request's fault: a fault programmed for its key first, then one
// programmed for the next requests, then a draw from the mix.
func (b *Bank) takeFault(key string) Fault {
	b.mu.Lock()
	defer b.mu.Unlock()
	var f Fault
	if q := b.keyFaults[key]; len(q) > 0 {
		f = q[0]
		if len(q) == 1 {
			delete(b.keyFaults, key)
		} else {
			b.keyFaults[key] = q[1:]
		}
	} else if len(b.next) > 0 {
		f = b.next[0]
		b.next = b.next[1:]
	} else {
		f = b.mix.draw(b.rng)
	}
	if f != NoFault {
		b.stats.Faults[f]++
	}
	return f
}

// error5xxStatus picks 500 or 503 from the seeded source, so both shapes of "the bank broke"
// reach the caller and a run still reproduces.
func (b *Bank) error5xxStatus() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rng.IntN(2) == 0 {
		return http.StatusInternalServerError
	}
	return http.StatusServiceUnavailable
}

// apply records req under key unless the key is already taken; the lookup and the insert share
// one critical section, which is what makes a second effect impossible. In strict mode a taken
// key is applied again, as a bank that does not remember keys would.
func (b *Bank) apply(key string, req PaymentRequest, rec *Request) (int, any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec.Decided = time.Now()
	if p, ok := b.payments[key]; ok && !b.cfg.Strict {
		if p.request() != req {
			b.stats.Conflicts++
			rec.Outcome = OutcomeConflict
			return http.StatusConflict, errorBody{
				Code: codeConflict,
				Message: fmt.Sprintf("idempotency key %q was already used for a different payment "+
					"(account %q, amount %d %s, reference %q); use a new key for a new payment",
					key, p.Account, p.Amount, p.Currency, p.Reference),
			}
		}
		b.stats.Replays++
		rec.Outcome = OutcomeReplayed
		return answer(p, http.StatusOK)
	}
	b.seq++
	p := &Payment{
		ID:             fmt.Sprintf("pay_%06d", b.seq),
		IdempotencyKey: key,
		Account:        req.Account,
		Amount:         req.Amount,
		Currency:       req.Currency,
		Reference:      req.Reference,
		Status:         StatusSucceeded,
		CreatedAt:      b.cfg.Now().UTC(),
	}
	if reason := declineReason(req); reason != "" {
		p.Status, p.DeclineReason = StatusFailed, reason
		b.stats.Declined++
	} else {
		b.refs[p.Reference] = append(b.refs[p.Reference], key)
	}
	if _, ok := b.payments[key]; !ok {
		b.payments[key] = p
	}
	b.order = append(b.order, p)
	rec.Outcome, rec.Effect, rec.PaymentID = OutcomeApplied, true, p.ID
	if p.Status == StatusFailed {
		rec.Outcome = OutcomeDeclined
	}
	b.effects[key]++
	b.stats.Applied++
	return answer(p, http.StatusCreated)
}

// answer is the response for a stored payment; a decline answers 422 on every replay so the
// caller's classification does not depend on which attempt got through.
func answer(p *Payment, okStatus int) (int, any) {
	cp := *p
	if p.Status == StatusFailed {
		return http.StatusUnprocessableEntity, errorBody{
			Code:    codeDeclined,
			Message: fmt.Sprintf("payment under idempotency key %q declined: %s", p.IdempotencyKey, p.DeclineReason),
			Payment: &cp,
		}
	}
	return okStatus, &cp
}

func declineReason(req PaymentRequest) string {
	switch {
	case req.Amount <= 0:
		return fmt.Sprintf("amount %d must be positive", req.Amount)
	case strings.HasPrefix(req.Account, "closed-"):
		return fmt.Sprintf("account %q is closed", req.Account)
	}
	return ""
}
