package fakebank

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type testBundle struct {
	client *Client
	hc     *http.Client
}

// setup starts a bank on a free loopback port and a client for it. The client dials a fresh
// connection per request: net/http resends a request carrying an Idempotency-Key when a reused
// connection dies, which would turn DropAfterApply into a success and hide what a test checks.
func setup(t *testing.T, cfg *Config) (*Bank, *testBundle) {
	t.Helper()
	bank := New(cfg)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { require.NoError(t, bank.Close()) })
	hc := newHTTPClient(t, 2*time.Second)
	return bank, &testBundle{client: NewClient(bank.URL(), hc), hc: hc}
}

func newHTTPClient(t *testing.T, timeout time.Duration) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: timeout, Transport: tr}
}

func payReq(ref string, amount int64) PaymentRequest {
	return PaymentRequest{Account: "merchant-1", Amount: amount, Currency: "EUR", Reference: ref}
}

func TestPayReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)

	first, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 1250))
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, first.Status)
	require.Equal(t, "op-1", first.IdempotencyKey)
	require.Equal(t, int64(1250), first.Amount)

	for range 3 {
		again, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 1250))
		require.NoError(t, err)
		require.Equal(t, first, again)
	}

	require.Equal(t, 1, bank.Effects("op-1"))
	require.Len(t, bank.Applied(), 1)
	stats := bank.Stats()
	require.Equal(t, 4, stats.Requests)
	require.Equal(t, 1, stats.Applied)
	require.Equal(t, 3, stats.Replays)
	require.Empty(t, stats.Faults)
}

func TestPayStatusCodes(t *testing.T) {
	t.Parallel()
	bank, _ := setup(t, nil)

	post := func(key, body string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, bank.URL()+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp
	}
	t.Cleanup(http.DefaultClient.CloseIdleConnections)

	body := `{"account":"merchant-1","amount":100,"currency":"EUR","reference":"r"}`
	require.Equal(t, http.StatusCreated, post("k", body).StatusCode)
	// Reformatted JSON is the same request.
	require.Equal(t, http.StatusOK, post("k", `{ "reference":"r", "currency":"EUR", "amount":100, "account":"merchant-1" }`).StatusCode)
	require.Equal(t, http.StatusBadRequest, post("", body).StatusCode)
	require.Equal(t, http.StatusBadRequest, post("k2", `{"account":`).StatusCode)
	require.Equal(t, http.StatusBadRequest, post("k3", `{"account":"m","amount":1.5,"currency":"EUR"}`).StatusCode)
	require.Equal(t, http.StatusBadRequest, post("k4", `{"account":"m","amount":1,"currency":"eur"}`).StatusCode)
	require.Equal(t, http.StatusBadRequest, post("k5", `{"account":"","amount":1,"currency":"EUR"}`).StatusCode)

	require.Equal(t, 1, bank.Effects("k"))
	require.Equal(t, 7, bank.Stats().Requests)
	for _, key := range []string{"k2", "k3", "k4", "k5"} {
		require.Zero(t, bank.Effects(key), key)
	}
}

func TestPayConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)

	_, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 1250))
	require.NoError(t, err)

	_, err = bundle.client.Pay(ctx, "op-1", payReq("settle-1", 9999))
	require.Error(t, err)
	require.True(t, IsConflict(err))
	require.False(t, IsNotProcessed(err))
	require.False(t, IsDeclined(err))
	require.Contains(t, err.Error(), `"op-1"`)

	p, err := bundle.client.Lookup(ctx, "op-1")
	require.NoError(t, err)
	require.Equal(t, int64(1250), p.Amount)
	require.Equal(t, 1, bank.Effects("op-1"))
	require.Equal(t, 1, bank.Stats().Conflicts)
}

func TestPayDeclined(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		req    PaymentRequest
		reason string
	}{
		{"ZeroAmount", PaymentRequest{Account: "merchant-1", Amount: 0, Currency: "EUR"}, "amount 0 must be positive"},
		{"NegativeAmount", PaymentRequest{Account: "merchant-1", Amount: -5, Currency: "EUR"}, "amount -5 must be positive"},
		{"ClosedAccount", PaymentRequest{Account: "closed-9", Amount: 100, Currency: "EUR"}, `account "closed-9" is closed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bank, bundle := setup(t, nil)

			for range 2 { // the replay must answer exactly as the first attempt did
				_, err := bundle.client.Pay(ctx, "op-1", tt.req)
				require.Error(t, err)
				require.True(t, IsDeclined(err))
				require.False(t, IsNotProcessed(err))
				var e *Error
				require.ErrorAs(t, err, &e)
				require.Equal(t, http.StatusUnprocessableEntity, e.StatusCode)
				require.Contains(t, err.Error(), tt.reason)
			}

			p, err := bundle.client.Lookup(ctx, "op-1")
			require.NoError(t, err)
			require.Equal(t, StatusFailed, p.Status)
			require.Equal(t, tt.reason, p.DeclineReason)

			require.Equal(t, 1, bank.Effects("op-1"))
			require.Empty(t, bank.Statement(StatementQuery{}))
			stats := bank.Stats()
			require.Equal(t, 1, stats.Applied)
			require.Equal(t, 1, stats.Declined)
			require.Equal(t, 1, stats.Replays)
		})
	}
}

func TestLookupNotFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, bundle := setup(t, nil)

	_, err := bundle.client.Lookup(ctx, "never-sent")
	require.ErrorIs(t, err, ErrNotFound)
	require.False(t, IsNotProcessed(err))

	// Keys are opaque: slashes and spaces must survive the path.
	const key = "settle/2026-03-08 #7"
	paid, err := bundle.client.Pay(ctx, key, payReq("r", 1))
	require.NoError(t, err)
	got, err := bundle.client.Lookup(ctx, key)
	require.NoError(t, err)
	require.Equal(t, paid, got)
}

func TestLookupWrongURLIsNotNotFound(t *testing.T) {
	t.Parallel()
	bank, bundle := setup(t, nil)

	// A 404 from something that is not the bank must not read as "never applied", or a
	// reconciler pointed at the wrong path would resend.
	client := NewClient(bank.URL()+"/v2", bundle.hc)
	_, err := client.Lookup(context.Background(), "op-1")
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrNotFound)
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusNotFound, e.StatusCode)
}

// TestFaults checks, for each fault, what the client sees and what the bank applied, then that a
// resend under the same key ends with exactly one effect.
func TestFaults(t *testing.T) {
	t.Parallel()

	tests := []struct {
		fault        Fault
		status       []int // acceptable status codes; nil when no answer arrives
		notProcessed bool
		effects      int // effects right after the faulted request
	}{
		{fault: RefuseBeforeApply, status: []int{http.StatusTooManyRequests}, notProcessed: true, effects: 0},
		{fault: Error5xxBeforeApply, status: []int{http.StatusInternalServerError, http.StatusServiceUnavailable}, effects: 0},
		{fault: Error5xxAfterApply, status: []int{http.StatusInternalServerError, http.StatusServiceUnavailable}, effects: 1},
		{fault: DropAfterApply, effects: 1},
		{fault: DelayAfterApply, effects: 1},
	}
	for _, tt := range tests {
		t.Run(tt.fault.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bank, bundle := setup(t, &Config{Delay: 2 * time.Second})
			client := bundle.client
			if tt.fault == DelayAfterApply {
				client = NewClient(bank.URL(), newHTTPClient(t, 100*time.Millisecond))
			}

			bank.FailNext(1, tt.fault)
			_, err := client.Pay(ctx, "op-1", payReq("settle-1", 500))
			require.Error(t, err)
			require.Equal(t, tt.notProcessed, IsNotProcessed(err), "%v", err)
			require.False(t, IsDeclined(err))
			require.False(t, IsConflict(err))

			var e *Error
			require.ErrorAs(t, err, &e)
			if tt.status == nil {
				require.Zero(t, e.StatusCode)
				require.Error(t, e.Err)
			} else {
				require.Contains(t, tt.status, e.StatusCode)
			}
			if tt.fault == DelayAfterApply {
				var ne net.Error
				require.ErrorAs(t, err, &ne)
				require.True(t, ne.Timeout())
			}

			require.Equal(t, tt.effects, bank.Effects("op-1"))

			// What a reconciler would do: look, then resend under the same key.
			p, lookupErr := bundle.client.Lookup(ctx, "op-1")
			if tt.effects == 0 {
				require.ErrorIs(t, lookupErr, ErrNotFound)
			} else {
				require.NoError(t, lookupErr)
				require.Equal(t, StatusSucceeded, p.Status)
			}
			again, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 500))
			require.NoError(t, err)
			if p != nil {
				require.Equal(t, p, again)
			}

			require.Equal(t, 1, bank.Effects("op-1"))
			require.Len(t, bank.Applied(), 1)
			require.Empty(t, bank.DuplicateReferences())
			require.Equal(t, map[Fault]int{tt.fault: 1}, bank.Stats().Faults)
		})
	}
}

// TestError5xxIndistinguishable checks that no status tells an applied 5xx from an unapplied one.
func TestError5xxIndistinguishable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)

	seen := map[Fault]map[int]bool{Error5xxBeforeApply: {}, Error5xxAfterApply: {}}
	for i := range 40 {
		f := Error5xxBeforeApply
		if i%2 == 1 {
			f = Error5xxAfterApply
		}
		bank.FailNext(1, f)
		_, err := bundle.client.Pay(ctx, fmt.Sprintf("op-%d", i), payReq("r", 1))
		var e *Error
		require.ErrorAs(t, err, &e)
		seen[f][e.StatusCode] = true
	}
	require.Equal(t, seen[Error5xxBeforeApply], seen[Error5xxAfterApply])
	require.Len(t, seen[Error5xxAfterApply], 2)
	require.Len(t, bank.Applied(), 20)
}

func TestDelayAfterApplyAnswersEventually(t *testing.T) {
	t.Parallel()
	bank, bundle := setup(t, &Config{Delay: 50 * time.Millisecond})

	bank.FailNext(1, DelayAfterApply)
	start := time.Now()
	p, err := bundle.client.Pay(context.Background(), "op-1", payReq("settle-1", 500))
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, p.Status)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
}

func TestFailKeyAndFailNext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)

	bank.FailKey("op-b", RefuseBeforeApply)
	bank.FailNext(2, Error5xxBeforeApply)

	// op-a takes both FailNext faults; op-b's key fault does not use one up.
	_, err := bundle.client.Pay(ctx, "op-b", payReq("b", 1))
	require.True(t, IsNotProcessed(err))
	for range 2 {
		_, err = bundle.client.Pay(ctx, "op-a", payReq("a", 1))
		require.Error(t, err)
		require.False(t, IsNotProcessed(err))
	}
	_, err = bundle.client.Pay(ctx, "op-a", payReq("a", 1))
	require.NoError(t, err)
	_, err = bundle.client.Pay(ctx, "op-b", payReq("b", 1))
	require.NoError(t, err)

	require.Equal(t, map[Fault]int{RefuseBeforeApply: 1, Error5xxBeforeApply: 2}, bank.Stats().Faults)
	require.Equal(t, 1, bank.Effects("op-a"))
	require.Equal(t, 1, bank.Effects("op-b"))
}

func TestFailNextNoFaultShieldsFromMix(t *testing.T) {
	t.Parallel()
	bank, bundle := setup(t, &Config{Faults: Mix{RefuseBeforeApply: 1}})

	bank.FailNext(1, NoFault)
	_, err := bundle.client.Pay(context.Background(), "op-1", payReq("r", 1))
	require.NoError(t, err)
	_, err = bundle.client.Pay(context.Background(), "op-2", payReq("r2", 1))
	require.True(t, IsNotProcessed(err))
}

func TestSetDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)
	url := bank.URL()

	paid, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 100))
	require.NoError(t, err)

	require.NoError(t, bank.SetDown(true))
	require.NoError(t, bank.SetDown(true)) // already down: no-op

	_, err = bundle.client.Pay(ctx, "op-2", payReq("settle-2", 100))
	require.Error(t, err)
	require.True(t, IsNotProcessed(err), "%v", err)
	require.ErrorContains(t, err, "connection refused")
	_, err = bundle.client.Lookup(ctx, "op-1")
	require.ErrorContains(t, err, "connection refused")
	require.False(t, IsNotProcessed(err), "a read applies nothing; not-processed is a pay's")
	require.Zero(t, bank.Effects("op-2"))

	require.NoError(t, bank.SetDown(false))
	require.Equal(t, url, bank.URL())

	got, err := bundle.client.Lookup(ctx, "op-1")
	require.NoError(t, err)
	require.Equal(t, paid, got)
	_, err = bundle.client.Pay(ctx, "op-2", payReq("settle-2", 100))
	require.NoError(t, err)
	require.Equal(t, 1, bank.Effects("op-2"))

	// Down, up, down again: each generation's server goes away cleanly.
	require.NoError(t, bank.SetDown(true))
	require.NoError(t, bank.SetDown(false))
}

func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, _ := setup(t, nil)
	// Keep-alives on here: concurrency through a shared pool is the realistic case.
	tr := &http.Transport{MaxIdleConnsPerHost: 100}
	t.Cleanup(tr.CloseIdleConnections)
	client := NewClient(bank.URL(), &http.Client{Transport: tr, Timeout: 5 * time.Second})

	const n = 100
	var (
		wg      sync.WaitGroup
		results = make([]*Payment, n)
		errs    = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = client.Pay(ctx, "op-hot", payReq("settle-hot", 700))
		})
	}
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, results[0], results[i])
	}
	require.Equal(t, 1, bank.Effects("op-hot"))
	stats := bank.Stats()
	require.Equal(t, n, stats.Requests)
	require.Equal(t, 1, stats.Applied)
	require.Equal(t, n-1, stats.Replays)
}

func TestConcurrentKeysWithFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, &Config{Faults: Mix{RefuseBeforeApply: 0.2, Error5xxBeforeApply: 0.2, Error5xxAfterApply: 0.2}})

	// Each worker resends its key until it succeeds, as a sender and reconciler would together.
	const workers, keys = 8, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				key := fmt.Sprintf("op-%d", k)
				for attempt := 0; ; attempt++ {
					_, err := bundle.client.Pay(ctx, key, payReq("settle-"+key, int64(k+1)))
					if err == nil {
						break
					}
					if attempt > 100 {
						t.Errorf("worker %d: %s never succeeded: %v", w, key, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()

	for k := range keys {
		require.Equal(t, 1, bank.Effects(fmt.Sprintf("op-%d", k)))
	}
	require.Len(t, bank.Applied(), keys)
	require.Empty(t, bank.DuplicateReferences())
}

func TestDuplicateReferences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)

	// A caller that gave up on op-1 after an ambiguous error and resent under a new key.
	bank.FailNext(1, Error5xxAfterApply)
	_, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 100))
	require.Error(t, err)
	_, err = bundle.client.Pay(ctx, "op-1-retry", payReq("settle-1", 100))
	require.NoError(t, err)
	// A declined payment moved no money, so it does not make its reference a duplicate.
	_, err = bundle.client.Pay(ctx, "op-2", PaymentRequest{Account: "closed-1", Amount: 5, Currency: "EUR", Reference: "settle-2"})
	require.True(t, IsDeclined(err))
	_, err = bundle.client.Pay(ctx, "op-2-retry", payReq("settle-2", 5))
	require.NoError(t, err)

	want := map[string][]string{"settle-1": {"op-1", "op-1-retry"}}
	require.Equal(t, want, bank.DuplicateReferences())

	ledger, err := bundle.client.Ledger(ctx)
	require.NoError(t, err)
	require.Equal(t, want, ledger.DuplicateReferences())
	require.Equal(t, 1, ledger.Effects("op-1"))
	require.Equal(t, bank.Ledger(), ledger)
	require.Len(t, ledger.Payments, 4)
	require.Equal(t, StatusFailed, ledger.Payments[2].Status)
	require.Equal(t, map[Fault]int{Error5xxAfterApply: 1}, ledger.Stats.Faults)
}

func TestStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	base := time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)
	var (
		mu  sync.Mutex
		now = base
	)
	bank, bundle := setup(t, &Config{Now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}})
	payAt := func(at time.Time, key, currency string, amount int64) {
		mu.Lock()
		now = at
		mu.Unlock()
		_, err := bundle.client.Pay(ctx, key, PaymentRequest{Account: "merchant-1", Amount: amount, Currency: currency, Reference: key})
		if amount > 0 {
			require.NoError(t, err)
		}
	}
	payAt(base, "eur-0h", "EUR", 100)
	payAt(base.Add(1*time.Hour), "usd-1h", "USD", 200)
	payAt(base.Add(2*time.Hour), "eur-2h", "EUR", 300)
	payAt(base.Add(2*time.Hour), "eur-declined", "EUR", 0)
	payAt(base.Add(24*time.Hour), "eur-24h", "EUR", 400)

	keys := func(ps []Payment) []string {
		out := []string{}
		for _, p := range ps {
			out = append(out, p.IdempotencyKey)
		}
		return out
	}
	tests := []struct {
		name string
		q    StatementQuery
		want []string
	}{
		{"All", StatementQuery{}, []string{"eur-0h", "usd-1h", "eur-2h", "eur-24h"}},
		{"Currency", StatementQuery{Currency: "EUR"}, []string{"eur-0h", "eur-2h", "eur-24h"}},
		{"FromInclusive", StatementQuery{From: base.Add(2 * time.Hour)}, []string{"eur-2h", "eur-24h"}},
		{"ToExclusive", StatementQuery{To: base.Add(2 * time.Hour)}, []string{"eur-0h", "usd-1h"}},
		{"OneDayInEUR", StatementQuery{Currency: "EUR", From: base, To: base.Add(24 * time.Hour)}, []string{"eur-0h", "eur-2h"}},
		{"OtherZone", StatementQuery{From: base.Add(time.Hour).In(time.FixedZone("CET", 3600))}, []string{"usd-1h", "eur-2h", "eur-24h"}},
		{"Empty", StatementQuery{Currency: "GBP"}, []string{}},
	}
	for _, tt := range tests {
		got, err := bundle.client.Statement(ctx, tt.q)
		require.NoError(t, err, tt.name)
		require.Equal(t, tt.want, keys(got), tt.name)
		require.Equal(t, tt.want, keys(bank.Statement(tt.q)), tt.name)
	}

	resp, err := bundle.hc.Get(bank.URL() + "/statement?from=yesterday")
	require.NoError(t, err)
	var body errorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, body.Message, `from="yesterday"`)
}

// TestSeededFaultsReproduce runs the same request sequence against banks with the same and a
// different seed and compares what each request met.
func TestSeededFaultsReproduce(t *testing.T) {
	t.Parallel()
	mix := Mix{RefuseBeforeApply: 0.2, Error5xxBeforeApply: 0.2, Error5xxAfterApply: 0.2}

	run := func(seed uint64) []int {
		bank, bundle := setup(t, &Config{Seed: seed, Faults: mix})
		var statuses []int
		for i := range 60 {
			status := http.StatusCreated
			_, err := bundle.client.Pay(context.Background(), fmt.Sprintf("op-%d", i), payReq("r", 1))
			if err != nil {
				var e *Error
				require.ErrorAs(t, err, &e)
				status = e.StatusCode
			}
			statuses = append(statuses, status)
		}
		require.NotEmpty(t, bank.Stats().Faults)
		return statuses
	}

	first := run(7)
	require.Equal(t, first, run(7))
	require.NotEqual(t, first, run(8))
	require.Contains(t, first, http.StatusTooManyRequests)
	require.Contains(t, first, http.StatusCreated)
}

func TestSetFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)

	require.NoError(t, bundle.client.SetFaults(ctx, Mix{RefuseBeforeApply: 1}))
	_, err := bundle.client.Pay(ctx, "op-1", payReq("r", 1))
	require.True(t, IsNotProcessed(err))

	err = bundle.client.SetFaults(ctx, Mix{DropAfterApply: 0.7, DelayAfterApply: 0.7})
	require.Error(t, err)
	require.ErrorContains(t, err, "sum to")

	require.NoError(t, bank.SetFaults(Mix{}))
	_, err = bundle.client.Pay(ctx, "op-1", payReq("r", 1))
	require.NoError(t, err)
	require.Error(t, bank.SetFaults(Mix{RefuseBeforeApply: -0.1}))
}

func TestLatency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Delays", func(t *testing.T) {
		t.Parallel()
		bank, bundle := setup(t, &Config{Latency: 30 * time.Millisecond})
		start := time.Now()
		_, err := bundle.client.Pay(ctx, "op-1", payReq("r", 1))
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
		require.Equal(t, 1, bank.Effects("op-1"))
	})

	t.Run("BeforeProcessing", func(t *testing.T) {
		t.Parallel()
		bank, bundle := setup(t, &Config{Latency: time.Minute})

		// A caller that gives up during the latency cannot know; the bank applied nothing.
		shortCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := bundle.client.Pay(shortCtx, "op-1", payReq("r", 1))
		require.Error(t, err)
		require.False(t, IsNotProcessed(err))
		require.Zero(t, bank.Effects("op-1"))

		// Admin requests skip the latency so checking the ledger stays quick.
		ledger, err := bundle.client.Ledger(ctx)
		require.NoError(t, err)
		require.Empty(t, ledger.Payments)
	})
}

func TestLifecycle(t *testing.T) {
	t.Parallel()

	t.Run("NonLoopbackRefused", func(t *testing.T) {
		t.Parallel()
		bank := New(&Config{Addr: "0.0.0.0:0"})
		require.ErrorContains(t, bank.Start(), "not loopback")
		require.NoError(t, bank.Close())
	})

	t.Run("StartTwiceAndAfterClose", func(t *testing.T) {
		t.Parallel()
		bank := New(nil)
		require.Empty(t, bank.URL())
		require.Error(t, bank.SetDown(true))
		require.NoError(t, bank.Start())
		require.Error(t, bank.Start())
		require.NoError(t, bank.Close())
		require.NoError(t, bank.Close())
		require.Error(t, bank.Start())
		require.Error(t, bank.SetDown(false))
	})

	t.Run("CloseWhileDown", func(t *testing.T) {
		t.Parallel()
		bank := New(nil)
		require.NoError(t, bank.Start())
		require.NoError(t, bank.SetDown(true))
		require.NoError(t, bank.Close())
	})

	t.Run("CloseCutsDelay", func(t *testing.T) {
		t.Parallel()
		bank := New(&Config{Delay: time.Minute})
		require.NoError(t, bank.Start())
		bank.FailNext(1, DelayAfterApply)
		client := NewClient(bank.URL(), newHTTPClient(t, time.Minute))

		errc := make(chan error, 1)
		go func() {
			_, err := client.Pay(context.Background(), "op-1", payReq("r", 1))
			errc <- err
		}()
		// Close once the payment is applied, i.e. while the handler holds the answer.
		require.Eventually(t, func() bool { return bank.Effects("op-1") == 1 }, 2*time.Second, time.Millisecond)
		start := time.Now()
		require.NoError(t, bank.Close())
		require.Less(t, time.Since(start), time.Second)
		err := <-errc
		require.Error(t, err)
		require.False(t, IsNotProcessed(err))
	})

	t.Run("InvalidConfigPanics", func(t *testing.T) {
		t.Parallel()
		require.Panics(t, func() { New(&Config{Faults: Mix{DropAfterApply: 2}}) })
		require.Panics(t, func() { New(&Config{Delay: -time.Second}) })
	})
}

func TestMixValidate(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		mix     Mix
		wantErr string
	}{
		{"Zero", Mix{}, ""},
		{"One", Mix{DelayAfterApply: 1}, ""},
		{"SumsToOneWithRounding", Mix{RefuseBeforeApply: 0.1, Error5xxBeforeApply: 0.2, Error5xxAfterApply: 0.7}, ""},
		{"Negative", Mix{Error5xxAfterApply: -0.5}, "error_5xx_after_apply probability -0.5"},
		{"AboveOne", Mix{DropAfterApply: 1.5}, "drop_after_apply probability 1.5"},
		{"NaN", Mix{RefuseBeforeApply: nan()}, "refuse_before_apply probability NaN"},
		{"SumAboveOne", Mix{RefuseBeforeApply: 0.6, DropAfterApply: 0.6}, "sum to 1.2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.mix.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

func TestFaultText(t *testing.T) {
	t.Parallel()
	for f := NoFault; f < faultCount; f++ {
		text, err := f.MarshalText()
		require.NoError(t, err)
		var back Fault
		require.NoError(t, back.UnmarshalText(text))
		require.Equal(t, f, back)
	}
	var f Fault
	require.Error(t, f.UnmarshalText([]byte("meteor_strike")))
	require.Equal(t, "Fault(99)", Fault(99).String())
	require.Panics(t, func() { New(nil).FailNext(1, Fault(99)) })
}

func TestClassification(t *testing.T) {
	t.Parallel()

	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	read := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
	tests := []struct {
		name                             string
		err                              error
		notProcessed, declined, conflict bool
	}{
		{"Refused429", &Error{Op: "pay", StatusCode: 429, NotProcessed: true}, true, false, false},
		{"Dial", &Error{Op: "pay", NotProcessed: true, Err: dial}, true, false, false},
		// A dial error alone proves nothing: net/http's own resend of a request the bank
		// applied can end in "connection refused". Only the Client's wire record does.
		{"BareDialWrapped", fmt.Errorf("sending: %w", dial), false, false, false},
		{"Declined", &Error{Op: "pay", StatusCode: 422, Declined: true}, false, true, false},
		{"Conflict", &Error{Op: "pay", StatusCode: 409}, false, false, true},
		{"Plain429", &Error{Op: "pay", StatusCode: 429}, false, false, false},
		{"500", &Error{Op: "pay", StatusCode: 500}, false, false, false},
		{"Reset", &Error{Op: "pay", Err: read}, false, false, false},
		{"Timeout", &Error{Op: "pay", Err: context.DeadlineExceeded}, false, false, false},
		{"Unrelated", errors.New("boom"), false, false, false},
		{"Nil", nil, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.notProcessed, IsNotProcessed(tt.err))
			require.Equal(t, tt.declined, IsDeclined(tt.err))
			require.Equal(t, tt.conflict, IsConflict(tt.err))
		})
	}
}

func TestErrorMessage(t *testing.T) {
	t.Parallel()

	e := &Error{Op: "pay", Key: "op-1", StatusCode: 409, Body: `{"code":"conflict","error":"key reused"}`}
	require.Equal(t, `fakebank: pay "op-1": 409 Conflict: key reused`, e.Error())

	e = &Error{Op: "lookup", Key: "op-1", StatusCode: 404, Err: ErrNotFound}
	require.Equal(t, `fakebank: lookup "op-1": 404 Not Found: no payment under this idempotency key`, e.Error())

	e = &Error{Op: "ledger", StatusCode: 502, Body: "bad gateway\n"}
	require.Equal(t, "fakebank: ledger: 502 Bad Gateway: bad gateway", e.Error())
}
