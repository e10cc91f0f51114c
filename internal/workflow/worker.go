package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/faultpoint"
	"github.com/stepwise-go/stepwise/internal/jitter"
	"github.com/stepwise-go/stepwise/internal/pgtx"
	"github.com/stepwise-go/stepwise/internal/runctx"
	"github.com/stepwise-go/stepwise/internal/runwait"
	"github.com/stepwise-go/stepwise/internal/tracing"
)

// maxErrorLen bounds last_error on a run: an error message may embed a whole payload.
const maxErrorLen = 2000

// stepWorker is the River worker behind a Stepper. Its Work is the step protocol of
// docs/design.md: claim, then fenced steps until the slice ends or the run finishes.
type stepWorker[A river.JobArgs, C any] struct {
	river.WorkerDefaults[A]
	e       *Engine
	w       Stepper[A, C]
	slice   time.Duration
	workers *river.Workers // the bundle it was added to: whose config's RetryPolicy applies
	retries retryStash     // per job: the failures in a row its pending retry follows
	outside retryStash     // per job: its errors outside the steps in a row, in this process
}

func decodeCursorInto(raw json.RawMessage, dst any) error {
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

// Timeout gives an attempt its slice plus room for the last step to commit and the lease to
// be released; River's default (1 minute) knows nothing of our slices.
func (sw *stepWorker[A, C]) Timeout(*river.Job[A]) time.Duration {
	return sw.slice + 2*sw.e.cfg.Lease + 10*time.Second
}

type attempt[A river.JobArgs, C any] struct {
	sw    *stepWorker[A, C]
	job   *river.Job[A]
	key   string
	lease *checkpoint.Lease
	// waitOpen: the run has an open wait, which the attempt's next step takes (wait.go);
	// waitHeld: the step being committed recorded a wait whose condition held at once.
	waitOpen, waitHeld bool
}

// Work is one attempt of the step protocol (work), with what it returns settled so that only
// the run's own failure budget ever ends the run (settle).
func (sw *stepWorker[A, C]) Work(ctx context.Context, job *river.Job[A]) (err error) {
	sw.retries.forget(job.ID)
	// The back-off of an error outside the steps follows the run's failures in a row as
	// they stand (it is not one of them): what its next failure would wait. 1 until the run
	// has been read.
	failures := 1
	defer func() {
		if r := recover(); r != nil {
			// Guards: a panic outside the user's step (the step's own is an error already)
			// reaching River, which on the job's last attempt discards the job.
			err = fmt.Errorf("stepwise worker panicked on job %d: %v\n%s", job.ID, r, debug.Stack())
		}
		err = sw.settle(ctx, job, err, failures)
	}()
	return sw.work(ctx, job, &failures)
}

// work runs the attempt. It sets *failures to the run's failures in a row plus one once it
// has read the run.
func (sw *stepWorker[A, C]) work(ctx context.Context, job *river.Job[A], failures *int) (err error) {
	e := sw.e
	key, traceParent, err := runKeyOf(job.Metadata, job.Args)
	if err != nil {
		// Without a key there is no checkpoint to resume from; retrying cannot help.
		return river.JobCancel(err)
	}
	// The attempt's span is linked, not parented, to the span that queued the job (the
	// run's start, or the takeover that re-enqueued it): an attempt may come hours later.
	ctx, span := e.tracer.Start(ctx, "stepwise.attempt")
	defer func() { endAttemptSpan(span, err) }()
	if span.IsRecording() {
		tracing.LinkTo(span, traceParent)
		span.SetAttributes(attribute.String("stepwise.run.key", key), attribute.String("stepwise.workflow", job.Kind),
			attribute.Int64("stepwise.job.id", job.ID), attribute.Int("stepwise.job.attempt", job.Attempt))
	}
	run, err := e.runForJob(ctx, key, job.JobRow)
	if err != nil {
		return err
	}
	*failures = run.FailuresInARow + 1
	switch {
	case run.Status.Finished():
		// A duplicate or rescued job for a finished run: nothing to do, and nothing to redo.
		return nil
	case run.RiverJobID != nil && *run.RiverJobID != job.ID:
		// Superseded: maintenance re-enqueued the run under another job after this one's
		// worker vanished (e.g. River rescued this job an hour later). Only the run's
		// current job may work it.
		e.logger.InfoContext(ctx, "stepwise: job superseded, exiting", "run", key, "job", job.ID, "current_job", *run.RiverJobID)
		return nil
	case run.WakeAt != nil && run.Wait == nil && run.Awaiting == nil:
		// Guards: a sleeping run worked before its wake time. The run's wake_at, committed
		// with its Sleep, is the promise; the job's schedule only carries it. A job can be
		// delivered early: an attempt that took its committed Sleep for a failure and went
		// back to River for a retry, River's rescuer, an operator's "retry now" in River's
		// UI. A resume clears wake_at. Not a claim, not a failure: the job goes back to sleep.
		// Waits are not held here: their next step checks the condition again and re-enters
		// the wait when it does not hold, so an early job is safe (and "retry now" on a wait
		// whose condition holds must work). Measured on the database's clock, which River's
		// schedule uses: a worker whose clock runs behind would otherwise snooze again each
		// time River hands it the job.
		early, err := sleepsOn(ctx, e.pool, key)
		if err != nil {
			return err
		}
		if early > 0 {
			e.logger.WarnContext(ctx, "stepwise: job delivered before its run's wake time; snoozing it until then",
				"run", key, "job", job.ID, "wake_at", *run.WakeAt, "early_by", early.Round(time.Millisecond))
			return river.JobSnooze(early)
		}
	}

	owner := ownerOf(job.JobRow)
	claimCtx, claimSpan := e.tracer.Start(ctx, "stepwise.claim")
	lease, err := e.store.Claim(claimCtx, key, owner, job.Attempt)
	if err != nil {
		var held *checkpoint.HeldError
		if errors.As(err, &held) {
			endClaimSpan(claimSpan, key, owner, nil, "held", nil)
			// Someone holds a live lease: never run beside it. Come back when it lapses,
			// with jitter so a crowd of waiters does not stampede the row.
			return river.JobSnooze(held.RetryIn + jitter.UpTo(e.cfg.Lease/10+time.Millisecond))
		}
		endClaimSpan(claimSpan, key, owner, nil, "error", err)
		return err
	}
	// The heartbeat runs from the claim on, not from the first step. Guards against: an
	// attempt slow between its claim and its first step (markRunning waiting for a busy pool's
	// connection, a large cursor decoding on a loaded machine) outliving the lease its claim
	// took, and a live worker taken over. The run key travels with the step, so that
	// outbox.Enqueue ties operations to this run.
	stepCtx, cancel := context.WithCancelCause(runctx.With(ctx, key))
	defer cancel(nil)
	stopHeartbeat := e.store.Heartbeat(stepCtx, lease, e.cfg.Heartbeat, func(err error) {
		if !e.fence.Enforced() {
			return // test-only broken build: a lost lease goes unnoticed
		}
		if errors.Is(err, checkpoint.ErrFenced) {
			cancel(err)
			return
		}
		cancel(fmt.Errorf("%w: %w", errLeaseLost, err))
	})
	defer stopHeartbeat()
	if err := faultpoint.Hit(faultpoint.AfterClaim); err != nil {
		endClaimSpan(claimSpan, key, owner, lease, "error", err)
		_ = e.store.Release(ctx, lease)
		return err
	}

	a := &attempt[A, C]{sw: sw, job: job, key: key, lease: lease, waitOpen: run.Wait != nil}
	// The cursor's version decides (cursorversion.go): read it, upgrade it, wait for a newer
	// worker, or fail naming the versions.
	if stop, err := a.admitCursor(ctx, run, func(outcome string, err error) { endClaimSpan(claimSpan, key, owner, lease, outcome, err) }); stop {
		return err
	}
	// Guards: a takeover or a finish between our read of the run and the claim. Only the
	// run's current job may work it; this one gives the lease straight back.
	ok, err := markRunning(claimCtx, e.pool, key, job.ID)
	if err != nil {
		endClaimSpan(claimSpan, key, owner, lease, "error", err)
		_ = e.store.Release(ctx, lease)
		return fmt.Errorf("marking run %q running: %w", key, err)
	}
	if !ok {
		endClaimSpan(claimSpan, key, owner, lease, "moved", nil)
		_ = e.store.Release(ctx, lease)
		e.logger.InfoContext(ctx, "stepwise: run moved on before this job could work it, exiting", "run", key, "job", job.ID)
		return nil
	}
	endClaimSpan(claimSpan, key, owner, lease, "claimed", nil)

	if run.CancelRequestedAt != nil {
		return a.finishCancelled(ctx)
	}

	stopWatch := a.watchCancel(stepCtx, cancel)
	defer stopWatch()

	deadline := time.Now().Add(sw.slice)
	for {
		if ctx.Err() != nil {
			// Guards against: a hard stop (StopAndCancel, a deploy's last resort) or the job's
			// timeout landing while a step's COMMIT was in flight. The commit is not cancelled
			// with the step (see commit) and lands; the next step would then begin on a
			// cancelled context, fail, and be charged to the run as a failure: on a job with
			// one attempt, the run failed for a deploy. No step has begun: end the attempt.
			return a.stopped(ctx, nil)
		}
		res, err := a.step(stepCtx, deadline)
		if err != nil {
			if errors.Is(ctx.Err(), context.Canceled) && !errors.Is(err, checkpoint.ErrFenced) &&
				!errors.Is(context.Cause(stepCtx), ErrRunCancelled) && !errors.Is(err, ErrRunCancelled) {
				// River stopped the attempt (a hard stop, or the client's context ended) in
				// the middle of a step, which rolled back. Guards against: a deploy charged to
				// the run as a failure of its step (on a job of one attempt, failing it).
				// The job's timeout (context.DeadlineExceeded) still is a failure: a step
				// that always outlives it must end in the crash-loop guard, not loop forever.
				// A fenced step and an operator's cancel go on as usual: their audit events
				// and the run's end are recorded whatever stopped the attempt.
				return a.stopped(ctx, err)
			}
			if cause := context.Cause(stepCtx); cause != nil && stepCtx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("%w (step interrupted: %w)", err, cause)
			}
			return a.stepFailed(ctx, err)
		}
		switch res.next.kind {
		case nextContinue:
			if res.released {
				// The lease was released in the step's commit (marked released, so
				// maintenance leaves the run alone until River records the snooze).
				// Snooze(0) hands the run back to River: available at once, for any worker.
				return river.JobSnooze(0)
			}
		case nextDone:
			return nil
		case nextSleep:
			// The wake time was committed with the step; snooze until exactly then.
			return river.JobSnooze(max(time.Until(res.wakeAt), 0))
		case nextFail:
			return river.JobCancel(res.next.err)
		case nextWait:
			return nil // the job was completed in the step's commit; the timeout job delivers the run
		}
	}
}

// stepResult is what a committed step leads to.
type stepResult struct {
	next     Next
	released bool      // the lease was released in the step's commit
	wakeAt   time.Time // for Sleep/Until: when the run is due again
}

// errZeroNext is returned for a step that returned Next{}: the zero value says nothing, and
// taking it for Continue looped forever on a step that forgot to say it was done.
var errZeroNext = errors.New("returned workflow.Next{} (the zero value); return workflow.Continue() to run the next step, workflow.Done() to finish the run, or Sleep/Until/Fail")

// stepTx is the step's transaction as the step sees it. Commit and Rollback belong to the
// protocol: a step's Commit would land its writes without the fenced cursor write, so a
// zombie's writes could commit; a Rollback would leave the protocol committing nothing.
// Both are refused, and the step fails with the reason.
type stepTx struct {
	pgx.Tx
	misuse error
}

func (t *stepTx) Commit(context.Context) error {
	t.misuse = errors.New("called Step.Tx.Commit; Stepwise commits the step's transaction itself, with the cursor and fenced by the run's token: return workflow.Continue() or Done() instead")
	return t.misuse
}

func (t *stepTx) Rollback(context.Context) error {
	t.misuse = errors.New("called Step.Tx.Rollback; return an error from Step to roll the step back (the run is retried from its last cursor), or workflow.Fail(err) to end it")
	return t.misuse
}

// step runs one step of the protocol: begin (stall timeout armed, token checked), the user's
// step in the tx, the fenced write, the run's outcome, commit.
func (a *attempt[A, C]) step(ctx context.Context, deadline time.Time) (res stepResult, err error) {
	e := a.sw.e
	// The step's span is in the step's context, so that what the step enqueues (outbox)
	// records it as the operation's origin. Number and token are taken before the commit
	// moves the lease on.
	ctx, span := e.tracer.Start(ctx, "stepwise.step")
	var s *Step[A, C]
	number, token := a.lease.Steps+1, a.lease.Token
	defer func() {
		if span.IsRecording() {
			items := -1
			if s != nil && s.itemsSet {
				items = s.items
			}
			recordStepSpan(span, a.key, number, token, items, res, err)
		}
		span.End()
	}()
	tx, err := e.fence.Begin(ctx, a.lease)
	if err != nil {
		return stepResult{}, err
	}
	defer pgtx.Rollback(ctx, tx)

	// Each step starts from the committed cursor, decoded afresh: a failed step may have
	// mutated a cursor holding maps or slices, and that must not leak into the retry.
	var cursorIn C
	if err := decodeCursorInto(a.lease.Cursor, &cursorIn); err != nil {
		return stepResult{}, err
	}
	userTx := &stepTx{Tx: tx}
	s = &Step[A, C]{
		Tx:     userTx,
		Args:   a.job.Args,
		Cursor: cursorIn,
		RunKey: a.key,
		Number: a.lease.Steps + 1,
		Token:  a.lease.Token,
		Job:    a.job,
		raw:    tx,
	}
	// The step after a wait takes it first (wait.go); a wake that came before the condition
	// held re-enters the wait without running the user's step.
	var rewait *waitSpec
	if a.waitOpen {
		if s.woken, rewait, err = a.resolveWait(ctx, tx); err != nil {
			return stepResult{}, err
		}
	}
	var next Next
	if rewait != nil {
		next = Next{kind: nextWait, wait: rewait}
	} else {
		next, err = callStep(ctx, a.sw.w, s)
	}
	if userTx.misuse != nil {
		// Guards: a step that committed or rolled back the protocol's transaction itself.
		return stepResult{}, fmt.Errorf("step %d of run %q %w", s.Number, a.key, userTx.misuse)
	}
	if err != nil {
		return stepResult{}, err
	}
	if next.kind == nextUnset {
		return stepResult{}, fmt.Errorf("step %d of run %q %w", s.Number, a.key, errZeroNext)
	}
	cursor, err := json.Marshal(s.Cursor)
	if err != nil {
		return stepResult{}, fmt.Errorf("encoding cursor %T of run %q: %w", s.Cursor, a.key, err)
	}

	// Fence first: everything the step wrote commits only if this attempt still holds the
	// run. A worker paused past its lease finds its token superseded here and rolls back.
	// The slice is judged when the step ends, not when it began: an attempt that goes on
	// past its slice must give the lease up in this very commit, or its successor would
	// find it held and wait a whole lease.
	// A wait whose condition holds already goes on at once, as Continue (wait.go).
	var waitAt time.Time
	if next.kind == nextWait {
		if next, waitAt, err = a.beginWait(ctx, tx, next); err != nil {
			return stepResult{}, err
		}
	}
	release := next.kind != nextContinue || time.Now().After(deadline) || e.draining.Load()
	advance := &checkpoint.AdvanceOpts{Release: release, CursorVersion: cursorVersionOf(a.sw.w)}
	res = stepResult{next: next, released: release}
	pipeline := false
	if next.kind == nextContinue && !release {
		if pipeline, err = e.pipelineCommit(ctx, tx); err != nil {
			return stepResult{}, err
		}
	}
	if pipeline {
		// The common step writes nothing after the fenced write, so the write and the
		// COMMIT go to the server together, one round trip instead of two; a refused write
		// aborts the transaction and the COMMIT behind it (checkpoint.AdvanceCommit).
		if err := faultpoint.Hit(faultpoint.StepBeforeCommit); err != nil {
			return stepResult{}, err
		}
		if err := a.advanceCommit(ctx, tx, cursor, advance); err != nil {
			if errors.Is(err, checkpoint.ErrFenced) {
				return stepResult{}, err
			}
			return stepResult{}, fmt.Errorf("committing step %d of run %q: %w", s.Number, a.key, err)
		}
		return a.committed(next, res)
	}
	if err := e.fence.Advance(ctx, tx, a.lease, cursor, advance); err != nil {
		return stepResult{}, err
	}

	switch next.kind {
	case nextContinue, nextSleep:
		if !release {
			break
		}
		// A release on purpose is recorded with the commit that releases, so maintenance
		// never mistakes the gap before River records the snooze for a dead worker; a Sleep's
		// wake time is kept for a takeover should this process die inside that gap.
		var wake *time.Time
		reason := "slice"
		if next.kind == nextSleep {
			res.wakeAt = time.Now().Add(next.sleepFor(time.Now()))
			wake, reason = &res.wakeAt, "sleep"
		}
		if err := markReleased(ctx, tx, a.key, a.actor(), reason, wake); err != nil {
			return stepResult{}, err
		}
	case nextDone:
		if err := finishByWorker(ctx, tx, a.key, a.actor(), RunStatusSucceeded, nil, a.lease.Steps); err != nil {
			return stepResult{}, err
		}
		// River's JobCompleteTx does not fence, and on a job that already left 'running'
		// it returns the old row with a nil error. Our fenced write came first in this tx;
		// the returned state is checked so a completed-elsewhere job is never mistaken for
		// our completion.
		done, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, a.job)
		if err != nil {
			return stepResult{}, fmt.Errorf("completing River job %d of run %q: %w", a.job.ID, a.key, err)
		}
		if done.State != rivertype.JobStateCompleted {
			return stepResult{}, fmt.Errorf("completing River job %d of run %q: job is %s, not running; refusing to commit", a.job.ID, a.key, done.State)
		}
	case nextWait:
		if err := a.enterWait(ctx, tx, next.wait, waitAt, ""); err != nil {
			return stepResult{}, err
		}
	case nextFail:
		msg := "step failed the run"
		if next.err != nil {
			msg = next.err.Error()
		}
		if err := finishByWorker(ctx, tx, a.key, a.actor(), RunStatusFailed, &msg, a.lease.Steps); err != nil {
			return stepResult{}, err
		}
	}

	if err := faultpoint.Hit(faultpoint.StepBeforeCommit); err != nil {
		return stepResult{}, err
	}
	if err := a.commit(ctx, tx); err != nil {
		return stepResult{}, fmt.Errorf("committing step %d of run %q: %w", s.Number, a.key, err)
	}
	return a.committed(next, res)
}

// committed is the bookkeeping after a step's commit landed.
func (a *attempt[A, C]) committed(next Next, res stepResult) (stepResult, error) {
	e := a.sw.e
	a.waitOpen, a.waitHeld = a.waitHeld, false
	e.metrics.steps.WithLabelValues(a.job.Kind).Inc()
	switch next.kind {
	case nextDone:
		e.metrics.finished.WithLabelValues(a.job.Kind, string(RunStatusSucceeded)).Inc()
	case nextFail:
		e.metrics.finished.WithLabelValues(a.job.Kind, string(RunStatusFailed)).Inc()
	}
	if err := faultpoint.Hit(faultpoint.AfterStepCommit); err != nil {
		return stepResult{}, err
	}
	return res, nil
}

// commit commits the step's transaction and, when COMMIT reports an error, finds out whether
// it landed anyway.
//
// Guards against: a committed step taken for a failed one. A COMMIT can land and still
// report an error: the connection cut while the answer was on its way, or the attempt's
// context cancelled under it — by the heartbeat, which finds the lease gone the moment a
// commit that releases it lands, before pgx has read the answer. The attempt then recorded
// a step error (clearing a Sleep's wake time) or snoozed its own job for a lease, and the
// job's next attempt ran the run's next step: the chaos sleepers profile saw a run that
// slept an hour wake 2.3 s later. So the COMMIT is not cancelled with the step (the fenced
// write already decided; cancelling can only make the outcome unknown), only bounded, and
// an error is followed by a read of the checkpoint: our token still current with our step
// counted means our commit landed, since only the token's holder advances it and any
// claim moves the token on. Anything else, or a failed read, is a step that did not commit.
func (a *attempt[A, C]) commit(ctx context.Context, tx pgx.Tx) error {
	e := a.sw.e
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StallTimeout+5*time.Second)
	defer cancel()
	err := tx.Commit(cctx)
	if err == nil {
		if err = faultpoint.Hit(faultpoint.CommitAnswerLost); err == nil {
			return nil
		}
	}
	if !a.landed(ctx, err, a.lease.Steps) {
		return err
	}
	return nil
}

// pipelineCommit reports whether steps may send the fenced write and COMMIT together: the
// database must have stepwise_fenced (migration 017), which the write calls when it is
// refused. Asked once per engine, in the first such step's transaction. Guards against: a
// build deployed before its migration ran failing every step with "function stepwise_fenced
// does not exist"; such a database gets the two round trips of earlier builds and a warning,
// until migrations.Migrate has run and the process restarts.
func (e *Engine) pipelineCommit(ctx context.Context, tx pgx.Tx) (bool, error) {
	switch e.fencedCommit.Load() {
	case 1:
		return true, nil
	case -1:
		return false, nil
	}
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT to_regprocedure('stepwise_fenced(text,bigint)') IS NOT NULL`).Scan(&ok); err != nil {
		return false, fmt.Errorf("looking for function stepwise_fenced (migration 017): %w", err)
	}
	if !ok {
		if e.fencedCommit.CompareAndSwap(0, -1) {
			e.logger.WarnContext(ctx, "stepwise: the database lacks migration 017 (function stepwise_fenced); "+
				"steps commit in two round trips instead of one until migrations.Migrate has run and this process restarts")
		}
		return false, nil
	}
	e.fencedCommit.Store(1)
	return true, nil
}

// advanceCommit is the fenced write and the COMMIT of a step that writes nothing after the
// write, sent together (checkpoint.AdvanceCommit), under commit's rules: not cancelled with
// the step, bounded, and an error other than the fence's followed by a read of the checkpoint,
// since the COMMIT may have landed with its answer lost.
func (a *attempt[A, C]) advanceCommit(ctx context.Context, tx pgx.Tx, cursor json.RawMessage, opts *checkpoint.AdvanceOpts) error {
	e := a.sw.e
	// Guards against: a step whose context ended before its write (an operator's cancel, a
	// lease the heartbeat could not renew in time, the job's timeout) committing because the
	// write now goes out with the COMMIT, on a context that is not cancelled. Before, the
	// write ran on the step's context and was refused; so it is here. A cancel that comes
	// once the write is on its way is the same race as one during a separate COMMIT.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("advancing checkpoint %q: %w", a.key, err)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StallTimeout+5*time.Second)
	defer cancel()
	err := e.fence.AdvanceCommit(cctx, tx, a.lease, cursor, opts)
	if err == nil {
		return nil
	}
	if errors.Is(err, checkpoint.ErrFenced) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function
		// stepwise_fenced is gone (a restore of an older schema, say): ask again, and fall
		// back, from the next step on. Nothing of this one ran.
		e.fencedCommit.Store(0)
	}
	// The lease is as before the step: one more step counted means ours landed.
	if !a.landed(ctx, err, a.lease.Steps+1) {
		return err
	}
	a.lease.Landed(cursor, opts)
	return nil
}

// landed reports whether the step whose COMMIT reported err landed anyway: our token still
// current, with steps counted. Only the token's holder advances the checkpoint and any claim
// moves the token on, so that is our commit. Anything else, or a failed read, is a step that
// did not commit.
func (a *attempt[A, C]) landed(ctx context.Context, err error, steps int64) bool {
	e := a.sw.e
	// Its own deadline: a COMMIT that used up its bound must still be looked up.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	st, gerr := e.store.Get(rctx, a.key)
	if gerr != nil || st.Token != a.lease.Token || st.Steps != steps {
		return false
	}
	e.logger.WarnContext(ctx, "stepwise: COMMIT reported an error but the step landed; the run goes on from it",
		"run", a.key, "step", steps, "error", err)
	return true
}

// sleepsOn is how long the run key still sleeps (its wake_at ahead of the database's clock),
// or 0.
func sleepsOn(ctx context.Context, q dbtx, key string) (time.Duration, error) {
	var us int64
	err := q.QueryRow(ctx, `SELECT coalesce(greatest(extract(epoch FROM wake_at - clock_timestamp()) * 1e6, 0), 0)::bigint
		FROM stepwise_run WHERE key = $1`, key).Scan(&us)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the wake time of run %q: %w", key, err)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// actor names this attempt in the audit trail and guards its run transitions by its job.
func (a *attempt[A, C]) actor() stepActor {
	return stepActor{owner: a.lease.Owner, token: a.lease.Token, attempt: a.job.Attempt, jobID: a.job.ID}
}

// callStep runs the user's step, turning a panic into an error so the transaction is rolled
// back and the run retried, instead of the worker process dying with the lease held.
func callStep[A river.JobArgs, C any](ctx context.Context, w Stepper[A, C], s *Step[A, C]) (next Next, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("step %d of run %q panicked: %v\n%s", s.Number, s.RunKey, r, debug.Stack())
		}
	}()
	return w.Step(ctx, s)
}

// stopped ends an attempt that River stopped between or inside steps. The lease goes back at
// once, recorded as a release on purpose (reason "stop") in the same transaction, and the
// context's cause goes to River wrapped in a stoppedError (see settle). Nothing is charged to
// the run: its last commit stands, and no step of it failed. stepErr is the rolled-back step's
// error, if a step was cut.
//
// Guards against: maintenance taking the run over as a crash in the gap before River records
// the job's end. A lease released without released_at looks, to the unleased scan, like a
// worker that vanished; on a job of one attempt that failed the run as a crash loop, for every
// run a deploy's hard stop caught. markReleased makes maintenance leave the run alone for two
// leases (unleasedGrace), as after a slice. (A run being worked has no wake time; markReleased's nil keeps it
// so.)
func (a *attempt[A, C]) stopped(ctx context.Context, stepErr error) error {
	e := a.sw.e
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := pgx.BeginFunc(rctx, e.pool, func(tx pgx.Tx) error {
		if ok, err := e.store.ReleaseIn(rctx, tx, a.lease); err != nil || !ok {
			return err // not ours any more: nothing to release, nothing to mark
		}
		return markReleased(rctx, tx, a.key, a.actor(), "stop", nil)
	})
	if err != nil {
		_ = e.store.Release(rctx, a.lease) // the run moved on, or the database failed: at least the lease
	}
	attrs := []any{"run", a.key, "steps", a.lease.Steps, "job", a.job.ID, "cause", context.Cause(ctx)}
	if stepErr != nil {
		attrs = append(attrs, "rolled_back", stepErr)
	}
	e.logger.InfoContext(ctx, "stepwise: attempt stopped by River; the run goes on from its last commit", attrs...)
	return &stoppedError{cause: context.Cause(ctx)}
}

// stoppedError is what an attempt River stopped returns: the context's cause, so that River
// handles a stop as a stop, marked so that settle neither warns about it nor counts it among
// the job's errors outside the steps.
type stoppedError struct{ cause error }

func (e *stoppedError) Error() string { return "attempt stopped: " + e.cause.Error() }
func (e *stoppedError) Unwrap() error { return e.cause }

// stepFailed handles a step that did not commit: everything it wrote is rolled back. A fenced
// attempt stops quietly (someone else owns the run now); any other error is recorded on the
// run, the lease released so the retry can claim at once, and returned for a retry after the
// back-off of the run's failures in a row (settle).
func (a *attempt[A, C]) stepFailed(ctx context.Context, stepErr error) error {
	e := a.sw.e
	if errors.Is(stepErr, ErrRunCancelled) {
		return a.finishCancelled(ctx)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if errors.Is(stepErr, errRunMoved) {
		// Guards: a run finished or taken over by someone else while this step ran (e.g.
		// maintenance failed it); the step rolled back and this job's work is over.
		_ = e.store.Release(cctx, a.lease)
		e.logger.WarnContext(ctx, "stepwise: run changed under the step, which was rolled back", "run", a.key, "job", a.job.ID, "error", stepErr)
		return nil
	}
	if !errors.Is(stepErr, checkpoint.ErrFenced) && e.fence.Enforced() && a.superseded(ctx) {
		// The step failed for another reason (context cancelled by a lost heartbeat, a
		// connection killed by the stall timeout) but the token has moved on: to the
		// operator this is the same event, a zombie's commit that did not land.
		stepErr = fmt.Errorf("%w: %w", checkpoint.ErrFenced, stepErr)
	}
	if errors.Is(stepErr, checkpoint.ErrFenced) {
		e.metrics.fenced.WithLabelValues(a.job.Kind).Inc()
		recordFenced(cctx, e.pool, a.key, a.actor(), stepErr)
		e.logger.WarnContext(ctx, "stepwise: commit refused, another worker owns the run", "run", a.key, "token", a.lease.Token, "owner", a.lease.Owner)
		run, err := GetRun(cctx, e.pool, a.key)
		if err == nil && (run.Status.Finished() || run.RiverJobID != nil && *run.RiverJobID != a.job.ID) {
			return nil // superseded by a takeover job, or ended by maintenance; this job's work is over
		}
		return river.JobSnooze(e.cfg.Lease + jitter.UpTo(e.cfg.Lease/10+time.Millisecond))
	}

	e.metrics.stepErrs.WithLabelValues(a.job.Kind).Inc()
	step := a.lease.Steps + 1
	e.logger.WarnContext(ctx, "stepwise: step failed and was rolled back; River retries it",
		"run", a.key, "step", step, "attempt", a.job.Attempt, "workflow", a.job.Kind, "error", stepErr)
	// The crash-loop guard counts this failure on the run (crashes and step errors, never
	// slices) and fails the run on the job's MaxAttempts-th failure in a row without progress.
	// The error then goes back for a retry whose back-off follows those failures in a row
	// (settle, NextRetry): River's own count, every error of the job, would make a run that
	// recovers between hiccups wait longer and longer, and on the job's last attempt discard it.
	msg := stepErr.Error()
	var (
		status   RunStatus
		failures int
	)
	err := pgx.BeginFunc(cctx, e.pool, func(tx pgx.Tx) error {
		var err error
		if status, failures, err = markStepError(cctx, tx, a.key, a.actor(), *truncate(&msg), a.job.MaxAttempts); err != nil || status != RunStatusFailed {
			return err
		}
		// The run ended failed: a parent waiting for its children wakes with this commit.
		return runwait.AfterChildFinished(cctx, tx, a.key)
	})
	_ = e.store.Release(cctx, a.lease)
	switch {
	case errors.Is(err, errRunMoved):
		return nil // the run is someone else's now
	case err != nil:
		// Unknown whether the failure was recorded: back off as if it had been; on the job's
		// last attempt settle keeps the job alive rather than let River discard it and leave
		// the run 'running' with no job. The next attempt's claim or maintenance sorts it out.
		e.logger.ErrorContext(ctx, "stepwise: recording step error", "run", a.key, "error", err)
		var streak int
		if run, gerr := GetRun(cctx, e.pool, a.key); gerr == nil {
			streak = run.FailuresInARow
		}
		return &retryError{err: stepErr, failures: streak + 1, step: true}
	case status == RunStatusFailed:
		e.metrics.finished.WithLabelValues(a.job.Kind, string(RunStatusFailed)).Inc()
		e.logger.WarnContext(ctx, "stepwise: run failed: its failures in a row reached the job's max attempts", "run", a.key, "max_attempts", a.job.MaxAttempts)
		return river.JobCancel(stepErr) // River must not retry a run that has ended
	}
	return &retryError{err: stepErr, failures: failures, step: true}
}

// retryError is an error that goes back to River for a retry, with the run's failures in a
// row that its back-off follows.
type retryError struct {
	err      error
	failures int
	step     bool // a step's error, recorded on the run (else an error outside the steps)
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// settle turns what an attempt returns into what River gets. A finish, a snooze or a cancel
// passes as it is. Any other error is retried with a back-off that follows the run's failures
// in a row (failures: for a step error the count it made, for an error outside the steps the
// count the run's next failure would make), asked of the user's river.Config.RetryPolicy
// (retryAt), never River's count of the job's errors ever.
//
// On the job's last attempt nothing is returned for River to count: River discards a job
// whose last attempt errs, and maintenance would then fail the run for its job ending, though
// only the run's own budget, its failures in a row, may fail it (markStepError,
// takeOver/finishByMaintenance). The job snoozes instead (a snooze is not an attempt), for
// the same back-off. Guards against: a database blip in claim or markRunning, a stop's
// cancelled context, or a step error of a run that recovered from its earlier ones, failing
// the run on the job's last attempt.
func (sw *stepWorker[A, C]) settle(ctx context.Context, job *river.Job[A], err error, failures int) error {
	var (
		snooze  *rivertype.JobSnoozeError
		cancel  *rivertype.JobCancelError
		retry   *retryError
		stopped *stoppedError
	)
	if err == nil || errors.As(err, &snooze) || errors.As(err, &cancel) {
		sw.outside.forget(job.ID)
		return err
	}
	step := false
	if errors.As(err, &retry) {
		failures, step = retry.failures, retry.step
		err = retry.err
		sw.outside.forget(job.ID)
	} else if errors.As(err, &stopped) {
		sw.outside.forget(job.ID) // a stop is no error of the job's
	} else {
		// An error outside the steps that repeats (the database unreachable, or refusing
		// this run's writes) must not retry at a constant pace forever once the job's
		// attempts are spent: its back-off also grows with the job's errors outside the
		// steps in a row, as this process has seen them.
		failures = max(failures, sw.outside.add(job.ID))
	}
	if ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)) {
		// The attempt was interrupted (a stop, a timeout): say so, with the cause River gave,
		// so that River handles a stop as a stop (the job back to available, no attempt
		// spent) however the error was worded on its way up.
		err = fmt.Errorf("%w (attempt interrupted: %w)", err, context.Cause(ctx))
	}
	e := sw.e
	if !step && stopped == nil {
		e.logger.WarnContext(ctx, "stepwise: attempt failed outside its steps (not counted as a failure of the run); River retries it",
			"job", job.ID, "attempt", job.Attempt, "workflow", job.Kind, "error", err)
	}
	if job.Attempt >= job.MaxAttempts {
		wait := max(time.Until(sw.retryAt(job.JobRow, failures)), 0)
		e.logger.InfoContext(ctx, "stepwise: the job's attempts are spent but the run's failure budget is not; snoozing instead of failing",
			"job", job.ID, "workflow", job.Kind, "failures_in_a_row", failures, "max_attempts", job.MaxAttempts, "retry_in", wait)
		return river.JobSnooze(wait)
	}
	sw.retries.put(job.ID, failures)
	return err
}

// NextRetry is River's hook for the time of a retry after an error this worker returned:
// the back-off for the run's failures in a row that settle recorded for the job.
//
// A worker whose config Install never saw cannot know the RetryPolicy River was given: it
// answers nothing, and River applies its client's policy to the job's own count.
func (sw *stepWorker[A, C]) NextRetry(job *river.Job[A]) time.Time {
	failures, ok := sw.retries.take(job.ID)
	if !ok {
		failures = 1
	}
	if _, known := sw.e.retryPolicy(sw.workers); !known {
		return time.Time{}
	}
	// River falls back to its default policy, with its own count, for a time already past
	// when it compares; a few milliseconds keep an immediate retry ours.
	return later(sw.retryAt(job.JobRow, failures), time.Now().Add(5*time.Millisecond))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// retryAt is when a run with failures in a row (at least 1) is tried again: the RetryPolicy
// of the river.Config the worker's bundle was installed with (River's default when none, or
// when Install never saw that config),
// asked about a copy of the job whose Attempt is the failures in a row and whose Errors hold
// one entry (numbered, without text) for each earlier failure in that row — so River's default
// policy gives failures^4 seconds. A policy that answers a time already past gets River's
// default instead, as River itself does.
func (sw *stepWorker[A, C]) retryAt(row *rivertype.JobRow, failures int) time.Time {
	failures = max(failures, 1)
	r := *row
	r.Attempt = failures
	r.Errors = make([]rivertype.AttemptError, failures-1)
	for i := range r.Errors {
		r.Errors[i].Attempt = i + 1
	}
	now := time.Now()
	var at time.Time
	if p, _ := sw.e.retryPolicy(sw.workers); p != nil {
		at = p.NextRetry(&r)
	}
	if at.Before(now) {
		at = (&river.DefaultClientRetryPolicy{}).NextRetry(&r)
	}
	return at
}

// retryStash is a count per job. As stepWorker.retries it holds the failures in a row that
// settle decided the back-off of the error it returned follows, until River asks NextRetry;
// an entry River never asks for (a stop, which River handles without a retry) is dropped at
// the job's next attempt here, or with the rest when the stash grows past a bound. As
// stepWorker.outside it counts a job's errors outside the steps in a row.
type retryStash struct {
	mu sync.Mutex
	m  map[int64]int
}

const retryStashMax = 10000

func (s *retryStash) put(jobID int64, failures int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= retryStashMax {
		s.m = map[int64]int{}
	}
	s.m[jobID] = failures
}

func (s *retryStash) add(jobID int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= retryStashMax {
		s.m = map[int64]int{}
	}
	s.m[jobID]++
	return s.m[jobID]
}

func (s *retryStash) take(jobID int64) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.m[jobID]
	delete(s.m, jobID)
	return f, ok
}

func (s *retryStash) forget(jobID int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, jobID)
}

// watchCancel polls for CancelRun every Heartbeat and cancels the step's context when asked.
// Polling beside the heartbeat costs one indexed read per interval per running run, and
// nothing per step.
func (a *attempt[A, C]) watchCancel(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	ctx, stopCtx := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(a.sw.e.cfg.Heartbeat)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			var requested bool
			err := a.sw.e.pool.QueryRow(ctx, `SELECT cancel_requested_at IS NOT NULL FROM stepwise_run WHERE key = $1`, a.key).Scan(&requested)
			if err == nil && requested {
				cancel(ErrRunCancelled)
				return
			}
		}
	}()
	return func() { stopCtx(); <-done }
}

// finishCancelled ends a run whose cancellation was requested, fenced so a zombie cannot end
// a run someone else now owns.
func (a *attempt[A, C]) finishCancelled(ctx context.Context) error {
	e := a.sw.e
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := pgx.BeginFunc(cctx, e.pool, func(tx pgx.Tx) error {
		if err := e.store.Advance(cctx, tx, a.lease, a.lease.Cursor, &checkpoint.AdvanceOpts{Release: true, CursorVersion: a.lease.CursorVersion}); err != nil {
			return err
		}
		return finishByWorker(cctx, tx, a.key, a.actor(), RunStatusCancelled, nil, a.lease.Steps)
	})
	if errors.Is(err, errRunMoved) || errors.Is(err, checkpoint.ErrFenced) {
		return nil // finished or taken over meanwhile (e.g. maintenance cancelled it)
	}
	if err != nil {
		return fmt.Errorf("finishing cancelled run %q: %w", a.key, err)
	}
	return river.JobCancel(fmt.Errorf("%w: %s", ErrRunCancelled, a.key))
}

// superseded reports whether another owner has claimed the run since this attempt did.
func (a *attempt[A, C]) superseded(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	st, err := a.sw.e.store.Get(cctx, a.key)
	return err == nil && st.Token != a.lease.Token
}

// failTerminal ends the run as failed without retry, for errors no retry can fix.
func (a *attempt[A, C]) failTerminal(ctx context.Context, cause error) error {
	e := a.sw.e
	msg := cause.Error()
	e.logger.ErrorContext(ctx, "stepwise: run failed terminally", "run", a.key, "error", msg)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := pgx.BeginFunc(cctx, e.pool, func(tx pgx.Tx) error {
		return finishByWorker(cctx, tx, a.key, a.actor(), RunStatusFailed, &msg, a.lease.Steps)
	})
	if err != nil && !errors.Is(err, errRunMoved) {
		return fmt.Errorf("recording terminal failure of run %q (%v): %w", a.key, cause, err)
	}
	_ = e.store.Release(cctx, a.lease)
	return river.JobCancel(cause)
}

// decodeCursor decodes the committed cursor strictly. A cursor that no longer fits the
// worker's type after a deploy (a field renamed or removed) must stop the run with the raw
// cursor kept, never silently restart the run from zero and redo committed work.
func (a *attempt[A, C]) decodeCursor(raw json.RawMessage) error {
	var c C
	if err := decodeCursorInto(raw, &c); err != nil {
		return fmt.Errorf("run %q: committed cursor does not decode into %T: %w; the raw cursor is kept in stepwise_checkpoint: %s",
			a.key, c, err, raw)
	}
	return nil
}

// runForJob returns the job's run, creating it (and its checkpoint) for a job inserted with
// plain River Insert and a RunKey method.
func (e *Engine) runForJob(ctx context.Context, key string, job *rivertype.JobRow) (*Run, error) {
	run, err := GetRun(ctx, e.pool, key)
	if err == nil || !errors.Is(err, ErrRunNotFound) {
		return run, err
	}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if err := checkpoint.Ensure(ctx, tx, key); err != nil {
			return err
		}
		return insertRunForJob(ctx, tx, key, job.Kind, job.EncodedArgs, job.ID)
	})
	if err != nil {
		return nil, fmt.Errorf("creating run %q for job %d: %w", key, job.ID, err)
	}
	return GetRun(ctx, e.pool, key)
}

func truncate(s *string) *string {
	if s == nil || len(*s) <= maxErrorLen {
		return s
	}
	t := (*s)[:maxErrorLen] + "…(truncated)"
	return &t
}

// ownerOf is the lease owner a worker claims a run under: the River client that fetched the
// job (the last of the row's attempted_by, which River's fetch appends), the job and its
// attempt. It is per attempt, not per host, for the audit trail and the console; what stops a
// stale attempt from renewing or committing is the fencing token (a snoozed job's re-fetch may
// carry the same owner). Maintenance rebuilds it from the same row in SQL to tell the lease of
// a job's own fetch from another's (leaseOfJobSQL in maintenance.go): keep the two equal. A
// row with no attempted_by (a job handed to the worker by hand, not fetched) gets an owner
// the SQL never matches: such a run is taken over by the two-Lease rule, never early.
func ownerOf(job *rivertype.JobRow) string {
	fetchedBy := "client"
	if n := len(job.AttemptedBy); n > 0 {
		fetchedBy = job.AttemptedBy[n-1]
	}
	return fmt.Sprintf("%s/job-%d/attempt-%d", fetchedBy, job.ID, job.Attempt)
}
