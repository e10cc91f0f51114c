package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/faultpoint"
	"github.com/stepwise-go/stepwise/internal/pgtx"
)

// recordTimeout bounds recording a batch's outcomes. Recording runs even when the
// dispatcher's context is cancelled (a shutdown mid-batch): the sends happened, and what we
// learned about them must not be thrown away.
const recordTimeout = 30 * time.Second

// DeliverBatch claims one batch of due operations of kind, sends them and records their
// outcomes. It returns how many operations it claimed (0 when none was due). The River
// dispatcher does the same continuously; tests and tools call this directly.
func (o *Outbox) DeliverBatch(ctx context.Context, kind string) (int, error) {
	ks, ok := o.kinds[kind]
	if !ok {
		return 0, fmt.Errorf("%w: %q; configured kinds are %v", ErrUnknownKind, kind, o.kindNames)
	}
	return o.pump(ctx, ks, time.Now().Add(time.Hour), true)
}

// Drain delivers batches of kind until none is due, and returns how many operations it
// claimed. Operations waiting for a backoff are not due and are left for later.
func (o *Outbox) Drain(ctx context.Context, kind string) (int, error) {
	ks, ok := o.kinds[kind]
	if !ok {
		return 0, fmt.Errorf("%w: %q; configured kinds are %v", ErrUnknownKind, kind, o.kindNames)
	}
	if _, err := o.recoverExpired(ctx, ks); err != nil {
		return 0, err
	}
	total := 0
	for {
		// A pump stops claiming once a claim comes back empty; operations that became due
		// while it finished (a quick RETRYABLE) are for the next one.
		n, err := o.pump(ctx, ks, time.Now().Add(24*time.Hour), false)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// RecoverExpired moves the PROCESSING operations of kind whose lease expired to
// UNKNOWN_EXTERNAL, and returns how many it moved. An expired lease means the dispatcher that
// claimed them died or stalled between claiming and recording (a kill -9 after the external
// system applied the request is exactly that), so they may have been sent: they are never
// resent blindly and never failed, but left to the reconciler.
func (o *Outbox) RecoverExpired(ctx context.Context, kind string) (int, error) {
	ks, ok := o.kinds[kind]
	if !ok {
		return 0, fmt.Errorf("%w: %q; configured kinds are %v", ErrUnknownKind, kind, o.kindNames)
	}
	return o.recoverExpired(ctx, ks)
}

func (o *Outbox) recoverExpired(ctx context.Context, ks *kindState) (int, error) {
	ks.mu.Lock()
	ks.lastExpiry = time.Now()
	ks.mu.Unlock()
	total := 0
	for {
		var n int
		err := pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `
				SELECT operation_id, claims, coalesce(leased_by, ''), lease_until FROM stepwise_operation
				WHERE kind = $1 AND state = 'PROCESSING' AND lease_until < now()
				ORDER BY lease_until LIMIT $2
				FOR UPDATE SKIP LOCKED`, ks.name, ks.cfg.BatchSize)
			if err != nil {
				return err
			}
			var ts []transition
			for rows.Next() {
				var t transition
				var by string
				var until time.Time
				if err := rows.Scan(pgtx.UUIDDest(&t.OperationID), &t.Claim, &by, &until); err != nil {
					rows.Close()
					return err
				}
				t.From, t.To, t.Actor = StateProcessing, StateUnknownExternal, o.actor
				t.Error = fmt.Sprintf("lease of %s expired at %s while PROCESSING: the dispatcher died or stalled after claiming, so it may have been sent",
					by, until.UTC().Format(time.RFC3339))
				t.Detail = map[string]any{"cause": "lease_expired", "leased_by": by}
				// The dispatcher died holding the claim: a request may have begun, so it counts
				// as one (unconfirmed: no start time), and could have been in flight until the
				// lease ran out (no Send starts with less than Timeout of its claim left).
				t.request = &requestRecord{lost: true}
				ts = append(ts, t)
			}
			if err := rows.Err(); err != nil {
				return err
			}
			out, err := o.transitionTx(ctx, tx, ts)
			n = len(out)
			return err
		})
		if err != nil {
			return total, fmt.Errorf("recovering expired leases of kind %q: %w", ks.name, err)
		}
		total += n
		if n < ks.cfg.BatchSize {
			return total, nil
		}
	}
}

// expiryEvery is how often a busy dispatcher looks for expired leases of its kind.
const expiryEvery = 5 * time.Second

// flushDelay bounds how long a known outcome waits for others to share its recording
// transaction.
const flushDelay = 20 * time.Millisecond

// delivered is one operation with the result of its send.
type delivered struct {
	op *Operation
	r  sendResult
}

// pump delivers operations of one kind as a pipeline: it claims a batch whenever no more
// than Concurrency + a batch of claimed operations is still outstanding (so a batch waits
// queued behind the sends in flight while the next claim is made: claiming only when at most
// Concurrency were outstanding left senders idle for each claim's round trip, 6-8% of the time
// at Concurrency 256 and a 50 ms bank), hands them to
// Concurrency senders, and records outcomes in transactions of up to BatchSize as they come
// back, on a recorder goroutine of its own. A slow send so holds up its own operation only, never a batch, and the round
// trips of claiming and recording overlap with sending.
//
// It stops claiming when nothing is due, when once is set and one batch was claimed, at the
// deadline, or when ctx ends; it returns once every claimed operation is recorded (or left
// PROCESSING for crash recovery, by a fault point), with the number it claimed.
func (o *Outbox) pump(ctx context.Context, ks *kindState, deadline time.Time, once bool) (int, error) {
	ks.mu.Lock()
	expiryDue := time.Since(ks.lastExpiry) > expiryEvery
	ks.mu.Unlock()
	if expiryDue {
		if _, err := o.recoverExpired(ctx, ks); err != nil {
			return 0, err
		}
	}

	b, c := ks.cfg.BatchSize, ks.cfg.Concurrency
	work := make(chan *Operation, 2*b+c)
	results := make(chan delivered, 2*b+c)
	var senders sync.WaitGroup
	for range c {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for op := range work {
				results <- delivered{op: op, r: o.sendIfRunning(ctx, ks, op)}
			}
		}()
	}
	stopRenewing := o.renewLeases(ctx, ks)
	defer func() {
		close(work)
		senders.Wait()
		stopRenewing()
	}()

	// Recording runs beside claiming and sending, on its own connection, so that neither
	// round trip waits for the other. Two batches may queue for it; then the pump waits.
	var (
		recordFailed atomic.Bool
		recordErrs   []error
		recordMu     sync.Mutex
		toRecord     = make(chan []delivered, 2)
		recorded     = make(chan struct{})
	)
	go func() {
		defer close(recorded)
		for batch := range toRecord {
			if err := o.record(ctx, ks, batch); err != nil {
				recordFailed.Store(true)
				recordMu.Lock()
				recordErrs = append(recordErrs, err)
				recordMu.Unlock()
			}
		}
	}()

	var (
		claimed, outstanding int
		done                 []delivered
		exhausted            bool
		errs                 []error
	)
	flushTimer := time.NewTimer(time.Hour)
	defer flushTimer.Stop()
	flush := func() {
		if len(done) > 0 {
			toRecord <- done
			done = make([]delivered, 0, b)
		}
	}
	for {
		if ctx.Err() != nil || !time.Now().Before(deadline) || (once && claimed > 0) || recordFailed.Load() || o.draining.Load() {
			// Past the deadline, stopping, or the database is failing us: claim no more,
			// finish what we hold.
			exhausted = true
		}
		if !exhausted && outstanding <= c+b {
			ops, err := o.claim(ctx, ks)
			switch {
			case err != nil:
				errs = append(errs, err)
				exhausted = true
			case len(ops) == 0:
				exhausted = true
			default:
				claimed += len(ops)
				// The claim is committed: from here a crash leaves these operations
				// PROCESSING until their lease expires, and then UNKNOWN_EXTERNAL.
				if err := faultpoint.Hit(faultpoint.AfterProcessing); err != nil {
					errs = append(errs, err)
					exhausted = true
					break
				}
				outstanding += len(ops)
				for _, op := range ops {
					work <- op
				}
			}
		}
		if outstanding == 0 {
			flush()
			if exhausted {
				break
			}
			continue
		}
		var flushC <-chan time.Time
		if len(done) > 0 {
			flushC = flushTimer.C
		}
		select {
		case d := <-results:
			outstanding--
			ks.book.release(d.op)
			o.metrics.sent(ks.name, d.r)
			if !d.r.abandoned { // an abandoned one stands for a crash: it stays PROCESSING
				done = append(done, d)
				if len(done) == 1 {
					flushTimer.Reset(flushDelay)
				}
			}
		case <-flushC:
			flush()
		}
		if len(done) >= b || (outstanding == 0 && len(done) > 0) {
			flush()
		}
	}
	close(toRecord)
	<-recorded
	errs = append(errs, recordErrs...)
	if claimed > 0 {
		if err := faultpoint.Hit(faultpoint.AfterOutcomeCommit); err != nil {
			errs = append(errs, err)
		}
	}
	return claimed, errors.Join(errs...)
}

// renewLeases keeps the leases of the operations this Outbox holds of kind alive until stop
// is called, so that an operation waiting for a sender, being sent or being recorded is never
// mistaken for one whose dispatcher died. It renews every lease not renewed in the last tick
// (an eighth of the lease), never past the kind's hold limit, so that a claim waiting its turn
// normally has well over the send timeout left when its sender takes it.
func (o *Outbox) renewLeases(ctx context.Context, ks *kindState) (stop func()) {
	lease := ks.cfg.Lease
	every := min(max(lease/8, 100*time.Millisecond), 10*time.Second)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
			qctx, c := context.WithTimeout(rctx, every)
			err := o.renew(qctx, ks, every, nil)
			c()
			if err != nil && rctx.Err() == nil {
				o.config.Logger.WarnContext(rctx, "stepwise outbox: renewing leases failed; they lapse unless a later renewal succeeds",
					slog.String("kind", ks.name), slog.String("error", err.Error()))
			}
		}
	}()
	return func() { cancel(); <-done }
}

// claimSQL takes a batch of due operations in one short statement (its own transaction):
// rows other dispatchers hold are skipped, not waited for, and every claimed row gets a lease,
// one more claim (the fence its outcome is recorded under; attempts count requests, at
// record time) and an audit event. Nothing is held locked while sending.
const claimSQL = `
WITH c AS (
	SELECT operation_id, state FROM stepwise_operation
	WHERE kind = $1 AND state IN ('PENDING', 'RETRYABLE') AND next_attempt_at <= now()
	ORDER BY next_attempt_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), u AS (
	UPDATE stepwise_operation o SET
		state        = 'PROCESSING',
		claims       = o.claims + 1,
		claimed_at   = now(),
		lease_until  = now() + $3::interval,
		leased_by    = $4,
		updated_at   = now()
	FROM c
	WHERE o.operation_id = c.operation_id
	RETURNING o.*, c.state AS from_state
), e AS (
	INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, attempt)
	SELECT 'op:' || u.operation_id, 'op.transition', u.from_state, 'PROCESSING', $4, u.claims FROM u
)
SELECT ` + "%s" + ` FROM u ORDER BY next_attempt_at`

var claimQuery = fmt.Sprintf(claimSQL, Columns("u"))

func (o *Outbox) claim(ctx context.Context, ks *kindState) ([]*Operation, error) {
	// The claim's validity is measured from before the statement, on the monotonic clock:
	// the database's lease starts later than this, never earlier.
	before := time.Now()
	rows, err := o.db.Query(ctx, claimQuery, ks.name, ks.cfg.BatchSize, ks.cfg.Lease, o.actor)
	if err != nil {
		return nil, fmt.Errorf("claiming operations of kind %q: %w", ks.name, err)
	}
	ops, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Operation, error) { return ScanOperation(r) })
	if err != nil {
		return nil, fmt.Errorf("claiming operations of kind %q: %w", ks.name, err)
	}
	ks.book.take(ops, before, ks.cfg.Lease)
	o.metrics.claimedN(ks.name, len(ops))
	return ops, nil
}

type sendResult struct {
	started   bool // Send was called (so it may have taken effect)
	abandoned bool // a fault point stopped us from recording: it stays PROCESSING
	dropped   bool // not sent: the claim could not be proven to outlast the send
	receipt   Receipt
	err       error
	elapsed   time.Duration
	start     time.Time // when Send was called (monotonic)
	end       time.Time // when it returned (monotonic)
}

// sendIfRunning sends op, unless the dispatcher is stopping or no longer certainly holds
// op's claim for the send timeout: an operation not handed to the Sender is definitely not
// sent, and goes back to RETRYABLE if the claim is still ours (the record is fenced by it).
func (o *Outbox) sendIfRunning(ctx context.Context, ks *kindState, op *Operation) sendResult {
	if ctx.Err() != nil || o.draining.Load() {
		return sendResult{}
	}
	if err := ks.limiter.Wait(ctx); err != nil {
		return sendResult{}
	}
	// Checked last, right before Send: the wait for a sender and for the rate limiter may
	// have outlasted the claim (a paused process, a lost database).
	if !o.claimHolds(ctx, ks, op) {
		o.config.Logger.WarnContext(ctx, "stepwise outbox: claim dropped before sending; the operation was not sent",
			slog.String("kind", ks.name), slog.String("operation_id", op.ID.String()), slog.Int("claim", op.Claims))
		return sendResult{dropped: true}
	}
	return o.sendOne(ctx, ks, op)
}

// panicError is a Sender's panic, classified like any unclassified error: UNKNOWN_EXTERNAL,
// because the panic may have come after the request left.
type panicError struct {
	value any
	stack string
}

func (e *panicError) Error() string { return fmt.Sprintf("sender panicked: %v", e.value) }

func (o *Outbox) sendOne(ctx context.Context, ks *kindState, op *Operation) (r sendResult) {
	r.started = true
	// The send's span, in the dispatcher's trace, links to the span that enqueued the
	// operation (a step's, maybe days ago); the Sender gets it in its context, so an
	// instrumented HTTP client carries it to the external system.
	ctx, span := o.tracer.Start(ctx, "stepwise.send")
	defer func() { endSendSpan(span, ks.name, op, r) }()
	sctx, cancel := context.WithTimeout(ctx, ks.cfg.Timeout)
	defer cancel()
	start := time.Now()
	r.start = start
	func() {
		defer func() {
			if p := recover(); p != nil {
				r.err = &panicError{value: p, stack: string(debug.Stack())}
			}
		}()
		sendOp := *op // the Sender gets its own copy; our record of the claim stays intact
		r.receipt, r.err = ks.cfg.Sender.Send(sctx, &sendOp)
	}()
	r.end = time.Now()
	r.elapsed = r.end.Sub(start)
	if pe, ok := r.err.(*panicError); ok {
		o.config.Logger.ErrorContext(ctx, "stepwise outbox: sender panicked; the operation is UNKNOWN_EXTERNAL",
			slog.String("kind", ks.name), slog.String("operation_id", op.ID.String()),
			slog.Any("panic", pe.value), slog.String("stack", pe.stack))
	}
	// The external call returned and nothing is recorded yet: a crash here is the case the
	// lease and the reconciler exist for.
	if err := faultpoint.Hit(faultpoint.AfterSend); err != nil {
		r.abandoned = true
	}
	return r
}

// outcomeOf turns a send's result into the transition it proves.
func (o *Outbox) outcomeOf(ks *kindState, op *Operation, r sendResult) (transition, bool) {
	t := transition{OperationID: op.ID, From: StateProcessing, Claim: op.Claims, Actor: o.actor}
	if r.abandoned {
		return t, false
	}
	if !r.started {
		// Never handed to the Sender: the dispatcher was stopping, or its claim ran short.
		// Definitely not sent; the claim fence drops this if somebody else moved it on.
		t.To, t.Error = StateRetryable, "not sent: the dispatcher stopped before sending"
		if r.dropped {
			t.Error = errClaimLost.Error()
		}
		return t, true
	}
	// A request began: it is recorded with its start and end, in the outcome's statement.
	now := time.Now()
	t.request = &requestRecord{startAgo: now.Sub(r.start), endAgo: now.Sub(r.end), timeout: ks.cfg.Timeout}
	attempts := op.Attempts + 1 // this request
	t.To = Classify(r.err)
	if r.err != nil {
		t.Error = r.err.Error()
	}
	switch t.To {
	case StateSucceeded:
		t.ExternalRef = r.receipt.ExternalRef
	case StateRetryable:
		if ks.cfg.MaxAttempts > 0 && attempts >= ks.cfg.MaxAttempts {
			t.To = StateManual
			t.Reason = fmt.Sprintf("gave up: not sent after %d attempts; last error: %s", attempts, truncateError(t.Error))
		} else {
			t.NextAt = time.Now().Add(ks.cfg.RetryBackoff(attempts))
		}
	}
	return t, true
}

// record writes a batch's outcomes, the business callbacks and the audit events in one
// transaction. If that fails (a callback refusing one operation, say), it falls back to one
// transaction per operation, so that one bad operation cannot hold back the others; one that
// still fails stays PROCESSING, and after its lease UNKNOWN_EXTERNAL, for the reconciler.
func (o *Outbox) record(ctx context.Context, ks *kindState, batch []delivered) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	ts := make([]transition, 0, len(batch))
	for _, d := range batch {
		if t, ok := o.outcomeOf(ks, d.op, d.r); ok {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return nil
	}
	batchErr := pgx.BeginFunc(rctx, o.db, func(tx pgx.Tx) error {
		_, err := o.transitionTx(rctx, tx, ts)
		return err
	})
	if batchErr == nil {
		return nil
	}
	var dbErrs []error
	for _, t := range ts {
		err := pgx.BeginFunc(rctx, o.db, func(tx pgx.Tx) error {
			_, err := o.transitionTx(rctx, tx, []transition{t})
			return err
		})
		if err == nil {
			continue
		}
		var cbErr *callbackError
		if !errors.As(err, &cbErr) {
			dbErrs = append(dbErrs, err)
			continue
		}
		// The business callback refuses this outcome. We cannot record one without the other,
		// so the operation waits for its lease and the reconciler, which will call it again.
		o.metrics.callbackFailed(ks.name)
		o.config.Logger.ErrorContext(ctx, "stepwise outbox: outcome callback failed; the operation stays PROCESSING until its lease expires",
			slog.String("kind", ks.name), slog.String("operation_id", t.OperationID.String()),
			slog.String("outcome", string(t.To)), slog.String("error", err.Error()))
		if _, err := o.db.Exec(rctx, `UPDATE stepwise_operation SET last_error = $2 WHERE operation_id = $1 AND state = 'PROCESSING' AND claims = $3`,
			t.OperationID, truncateError("outcome "+string(t.To)+" not recorded: "+err.Error()), t.Claim); err != nil {
			dbErrs = append(dbErrs, err)
		}
	}
	if len(dbErrs) > 0 {
		return fmt.Errorf("recording outcomes of kind %q (%d of %d failed): %w", ks.name, len(dbErrs), len(ts), errors.Join(dbErrs...))
	}
	return nil
}

// dispatch is the River dispatcher job: it delivers batches for at most one slice, then
// snoozes itself to run again; when no work is left it completes, in a transaction that
// proves nothing was enqueued meanwhile.
func (o *Outbox) dispatch(ctx context.Context, job *river.Job[dispatchArgs]) error {
	ks, ok := o.kinds[job.Args.OperationKind]
	if !ok {
		return river.JobCancel(fmt.Errorf("%w: %q has no KindConfig in this process; configure it, or do not work queue %q here",
			ErrUnknownKind, job.Args.OperationKind, QueueName(job.Args.OperationKind)))
	}
	stop := o.heartbeat(ctx, ks.name, job.ID)
	defer stop()
	if _, err := o.recoverExpired(ctx, ks); err != nil {
		return err
	}
	deadline := time.Now().Add(o.config.Slice)
	for {
		n, err := o.pump(ctx, ks, deadline, false)
		if ctx.Err() != nil || o.draining.Load() {
			// Shutting down: come back as soon as a client runs again, without counting an
			// attempt against the job.
			return river.JobSnooze(0)
		}
		if err != nil {
			return err
		}
		if n == 0 {
			idle, err := o.completeIfIdle(ctx, ks, job)
			if err != nil {
				return err
			}
			if idle {
				return nil
			}
			// Due work we could not claim: another dispatcher holds it this instant.
			select {
			case <-ctx.Done():
				return river.JobSnooze(0)
			case <-time.After(20 * time.Millisecond):
			}
		}
		if time.Now().After(deadline) {
			return river.JobSnooze(0)
		}
	}
}

// completeIfIdle completes the dispatcher job and then checks for due work, in one
// transaction. The order matters. A wake enqueued while this job runs is swallowed by its
// uniqueness, but River's unique insert locks this job's row until the waking transaction
// commits, so completing waits for that commit and the check after it sees the new rows (we
// roll back and go on). A wake that comes after our completion commits finds the job
// completed and queues a new one. Either way no operation waits for the poll. (A wake
// swallowed by a dead dispatcher's job is the waker's to pass on: passDeadDispatchers.)
func (o *Outbox) completeIfIdle(ctx context.Context, ks *kindState, job *river.Job[dispatchArgs]) (bool, error) {
	if _, err := river.ClientFromContextSafely[pgx.Tx](ctx); err != nil {
		return true, nil // not run by River (a test calling dispatch directly): nothing to complete
	}
	tx, err := o.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("completing the dispatcher of kind %q: %w", ks.name, err)
	}
	defer pgtx.Rollback(ctx, tx)
	// The transaction has begun (its now() is fixed) and nothing is decided yet: a stall here
	// (a slow round trip, a GC pause) is when operations committed meanwhile must still count.
	if err := faultpoint.Hit(faultpoint.DispatcherIdle); err != nil {
		return false, err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return false, fmt.Errorf("completing the dispatcher of kind %q: %w", ks.name, err)
	}
	// "Due" is judged by the clock when the check runs (clock_timestamp(), read once, after
	// the statement's snapshot), not by now(): now() is when this transaction began, and an
	// operation committed while it stalled (between Begin and here) is visible to the check
	// with a next_attempt_at later than that. Judged by now() it was "not yet due", the job
	// completed though the operation's wake had been swallowed by it, and the operation
	// waited for the poll.
	var due bool
	if err := tx.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM stepwise_operation
				WHERE kind = $1 AND state IN ('PENDING', 'RETRYABLE') AND next_attempt_at <= (SELECT clock_timestamp()))
			OR EXISTS (SELECT 1 FROM stepwise_operation
				WHERE kind = $1 AND state = 'PROCESSING' AND lease_until < (SELECT clock_timestamp()))`, ks.name).Scan(&due); err != nil {
		return false, fmt.Errorf("checking for due operations of kind %q: %w", ks.name, err)
	}
	if due {
		return false, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("completing the dispatcher of kind %q: %w", ks.name, err)
	}
	return true, nil
}

// heartbeat proves, every heartbeatEvery(), that a dispatcher of kind is alive, until stop is
// called. The poll reads it to tell a dispatcher that River still calls running but whose
// process is gone from one that is merely busy.
func (o *Outbox) heartbeat(ctx context.Context, kind string, jobID int64) (stop func()) {
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	beat := func() {
		bctx, c := context.WithTimeout(hctx, 5*time.Second)
		defer c()
		_, err := o.db.Exec(bctx, `
			INSERT INTO stepwise_outbox_dispatcher (kind, owner, river_job_id, heartbeat_at) VALUES ($1, $2, $3, now())
			ON CONFLICT (kind) DO UPDATE SET owner = $2, river_job_id = $3, heartbeat_at = now()`, kind, o.actor, jobID)
		if err != nil && hctx.Err() == nil {
			o.config.Logger.WarnContext(hctx, "stepwise outbox: dispatcher heartbeat failed", slog.String("kind", kind), slog.String("error", err.Error()))
		}
	}
	beat()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(o.heartbeatEvery())
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
				beat()
			}
		}
	}()
	return func() { cancel(); <-done }
}
