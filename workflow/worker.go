package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepwise-go/stepwise/checkpoint"
	"github.com/stepwise-go/stepwise/internal/faultpoint"
)

// maxErrorLen bounds last_error on a run: an error message may embed a whole payload.
const maxErrorLen = 2000

// stepWorker is the River worker behind a Stepper. Its Work is the step protocol of
// DESIGN.md: claim, then fenced steps until the slice ends or the run finishes.
type stepWorker[A river.JobArgs, C any] struct {
	river.WorkerDefaults[A]
	e     *Engine
	w     Stepper[A, C]
	slice time.Duration
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
}

func (sw *stepWorker[A, C]) Work(ctx context.Context, job *river.Job[A]) error {
	e := sw.e
	key, err := runKeyOf(job.Metadata, job.Args)
	if err != nil {
		// Without a key there is no checkpoint to resume from; retrying cannot help.
		return river.JobCancel(err)
	}
	run, err := e.runForJob(ctx, key, job.JobRow)
	if err != nil {
		return err
	}
	switch {
	case run.Status == StatusSucceeded || run.Status == StatusFailed || run.Status == StatusCancelled:
		// A duplicate or rescued job for a finished run: nothing to do, and nothing to redo.
		return nil
	case run.RiverJobID != nil && *run.RiverJobID != job.ID:
		// Superseded: maintenance re-enqueued the run under another job after this one's
		// worker vanished (e.g. River rescued this job an hour later). Only the run's
		// current job may work it.
		e.logger.InfoContext(ctx, "stepwise: job superseded, exiting", "run", key, "job", job.ID, "current_job", *run.RiverJobID)
		return nil
	}

	clientID := "client"
	if c, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil {
		clientID = c.ID()
	}
	// Owner ids are per attempt, not per host: two attempts in one process are different
	// owners, so a stale attempt can never renew the lease of a newer one.
	owner := fmt.Sprintf("%s/job-%d/attempt-%d", clientID, job.ID, job.Attempt)
	lease, err := e.store.Claim(ctx, key, owner, job.Attempt)
	if err != nil {
		var held *checkpoint.HeldError
		if errors.As(err, &held) {
			// Someone holds a live lease: never run beside it. Come back when it lapses,
			// with jitter so a crowd of waiters does not stampede the row.
			return river.JobSnooze(held.RetryIn + jitter(e.cfg.Lease/10+time.Millisecond))
		}
		return err
	}
	if err := faultpoint.Hit(faultpoint.AfterClaim); err != nil {
		_ = e.store.Release(ctx, lease)
		return err
	}

	a := &attempt[A, C]{sw: sw, job: job, key: key, lease: lease}
	if err := a.decodeCursor(lease.Cursor); err != nil {
		return a.failTerminal(ctx, err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'running', attempts = attempts + 1, updated_at = now()
		WHERE key = $1 AND status IN ('pending', 'running')`, key); err != nil {
		_ = e.store.Release(ctx, lease)
		return fmt.Errorf("marking run %q running: %w", key, err)
	}

	if run.CancelRequestedAt != nil {
		return a.finishCancelled(ctx)
	}

	stepCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWatch := a.watchCancel(stepCtx, cancel)
	defer stopWatch()
	stopHeartbeat := e.store.Heartbeat(stepCtx, lease, e.cfg.Heartbeat, func(err error) {
		if e.disableFence {
			return // test-only broken build: a lost lease goes unnoticed
		}
		if errors.Is(err, checkpoint.ErrFenced) {
			cancel(err)
			return
		}
		cancel(fmt.Errorf("%w: %w", errLeaseLost, err))
	})
	defer stopHeartbeat()

	deadline := time.Now().Add(sw.slice)
	for {
		next, released, err := a.step(stepCtx, deadline)
		if err != nil {
			if cause := context.Cause(stepCtx); cause != nil && stepCtx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("%w (step interrupted: %w)", err, cause)
			}
			return a.stepFailed(ctx, err)
		}
		switch next.kind {
		case nextContinue:
			if released {
				// The lease was released in the step's commit. Snooze(0) hands the run
				// back to River: it is available again at once, for any worker.
				return river.JobSnooze(0)
			}
		case nextDone:
			return nil
		case nextSleep:
			return river.JobSnooze(next.sleepFor(time.Now()))
		case nextFail:
			return river.JobCancel(next.err)
		}
	}
}

// step runs one step of the protocol: begin (stall timeout armed, token checked), the user's
// step in the tx, the fenced write, the run's outcome, commit.
func (a *attempt[A, C]) step(ctx context.Context, deadline time.Time) (next Next, released bool, err error) {
	e := a.sw.e
	var tx pgx.Tx
	if e.disableFence {
		tx, err = e.pool.Begin(ctx) // test-only broken build: no token check
	} else {
		tx, err = e.store.Begin(ctx, a.lease)
	}
	if err != nil {
		return Next{}, false, err
	}
	defer rollback(ctx, tx)

	// Each step starts from the committed cursor, decoded afresh: a failed step may have
	// mutated a cursor holding maps or slices, and that must not leak into the retry.
	var cursorIn C
	if err := decodeCursorInto(a.lease.Cursor, &cursorIn); err != nil {
		return Next{}, false, err
	}
	s := &Step[A, C]{
		Tx:     tx,
		Args:   a.job.Args,
		Cursor: cursorIn,
		RunKey: a.key,
		Number: a.lease.Steps + 1,
		Token:  a.lease.Token,
		Job:    a.job,
	}
	next, err = callStep(ctx, a.sw.w, s)
	if err != nil {
		return Next{}, false, err
	}
	cursor, err := json.Marshal(s.Cursor)
	if err != nil {
		return Next{}, false, fmt.Errorf("encoding cursor %T of run %q: %w", s.Cursor, a.key, err)
	}

	// Fence first: everything the step wrote commits only if this attempt still holds the
	// run. A worker paused past its lease finds its token superseded here and rolls back.
	// The slice is judged when the step ends, not when it began: an attempt that goes on
	// past its slice must give the lease up in this very commit, or its successor would
	// find it held and wait a whole lease.
	release := next.kind != nextContinue || time.Now().After(deadline) || e.draining.Load()
	if e.disableFence {
		// The same write as checkpoint.Advance without its fencing condition.
		_, err = tx.Exec(ctx, `UPDATE stepwise_checkpoint SET cursor = $2, steps = steps + 1, updated_at = now(),
			owner = CASE WHEN $3 THEN NULL ELSE owner END,
			lease_until = CASE WHEN $3 THEN NULL ELSE lease_until END
			WHERE key = $1`, a.key, cursor, release)
		a.lease.Steps++
		a.lease.Cursor = cursor
	} else {
		err = e.store.Advance(ctx, tx, a.lease, cursor, &checkpoint.AdvanceOpts{Release: release})
	}
	if err != nil {
		return Next{}, false, err
	}

	switch next.kind {
	case nextDone:
		if err := a.finishRun(ctx, tx, StatusSucceeded, nil); err != nil {
			return Next{}, false, err
		}
		// River's JobCompleteTx does not fence, and on a job that already left 'running'
		// it returns the old row with a nil error. Our fenced write came first in this tx;
		// the returned state is checked so a completed-elsewhere job is never mistaken for
		// our completion.
		done, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, a.job)
		if err != nil {
			return Next{}, false, fmt.Errorf("completing River job %d of run %q: %w", a.job.ID, a.key, err)
		}
		if done.State != rivertype.JobStateCompleted {
			return Next{}, false, fmt.Errorf("completing River job %d of run %q: job is %s, not running; refusing to commit", a.job.ID, a.key, done.State)
		}
	case nextFail:
		msg := "step failed the run"
		if next.err != nil {
			msg = next.err.Error()
		}
		if err := a.finishRun(ctx, tx, StatusFailed, &msg); err != nil {
			return Next{}, false, err
		}
	}

	if err := faultpoint.Hit(faultpoint.StepBeforeCommit); err != nil {
		return Next{}, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Next{}, false, fmt.Errorf("committing step %d of run %q: %w", s.Number, a.key, err)
	}
	e.metrics.steps.WithLabelValues(a.job.Kind).Inc()
	switch next.kind {
	case nextDone:
		e.metrics.finished.WithLabelValues(a.job.Kind, StatusSucceeded).Inc()
	case nextFail:
		e.metrics.finished.WithLabelValues(a.job.Kind, StatusFailed).Inc()
	}
	if err := faultpoint.Hit(faultpoint.AfterStepCommit); err != nil {
		return Next{}, false, err
	}
	return next, release, nil
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

func (a *attempt[A, C]) finishRun(ctx context.Context, tx pgx.Tx, status string, lastError *string) error {
	_, err := tx.Exec(ctx, `
		WITH r AS (
			UPDATE stepwise_run SET status = $2, last_error = $3, finished_at = now(), updated_at = now()
			 WHERE key = $1 RETURNING key
		)
		INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, token, attempt, detail)
		SELECT key, 'run.finish', 'running', $2, $4, $5, $6, jsonb_build_object('steps', $7::bigint) FROM r`,
		a.key, status, truncate(lastError), a.lease.Owner, a.lease.Token, a.job.Attempt, a.lease.Steps)
	if err != nil {
		return fmt.Errorf("finishing run %q as %s: %w", a.key, status, err)
	}
	return nil
}

// stepFailed handles a step that did not commit: everything it wrote is rolled back. A fenced
// attempt stops quietly (someone else owns the run now); any other error is recorded on the
// run, the lease released so the retry can claim at once, and returned for River's backoff.
func (a *attempt[A, C]) stepFailed(ctx context.Context, stepErr error) error {
	e := a.sw.e
	if errors.Is(stepErr, ErrRunCancelled) {
		return a.finishCancelled(ctx)
	}
	if !errors.Is(stepErr, checkpoint.ErrFenced) && !e.disableFence && a.superseded(ctx) {
		// The step failed for another reason (context cancelled by a lost heartbeat, a
		// connection killed by the stall timeout) but the token has moved on: to the
		// operator this is the same event, a zombie's commit that did not land.
		stepErr = fmt.Errorf("%w: %w", checkpoint.ErrFenced, stepErr)
	}
	if errors.Is(stepErr, checkpoint.ErrFenced) {
		e.metrics.fenced.WithLabelValues(a.job.Kind).Inc()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = e.pool.Exec(cctx, `INSERT INTO stepwise_event (subject, kind, actor, token, attempt, detail)
			VALUES ($1, 'lease.fenced', $2, $3, $4, jsonb_build_object('error', $5::text))`,
			a.key, a.lease.Owner, a.lease.Token, a.job.Attempt, stepErr.Error())
		e.logger.WarnContext(ctx, "stepwise: commit refused, another worker owns the run", "run", a.key, "token", a.lease.Token, "owner", a.lease.Owner)
		run, err := GetRun(cctx, e.pool, a.key)
		if err == nil && run.RiverJobID != nil && *run.RiverJobID != a.job.ID {
			return nil // superseded by a takeover job; this job's work is over
		}
		return river.JobSnooze(e.cfg.Lease + jitter(e.cfg.Lease/10+time.Millisecond))
	}

	e.metrics.stepErrs.WithLabelValues(a.job.Kind).Inc()
	// The last attempt's failure ends the run: River discards the job, and a run left
	// 'running' with no job would look alive forever.
	dead := a.job.Attempt >= a.job.MaxAttempts
	msg := stepErr.Error()
	if dead {
		msg = fmt.Sprintf("failed on its last attempt (%d of %d): %s", a.job.Attempt, a.job.MaxAttempts, msg)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := e.pool.Exec(cctx, `
		WITH r AS (
			UPDATE stepwise_run
			   SET last_error = $2, updated_at = now(),
			       status      = CASE WHEN $3 THEN 'failed' ELSE status END,
			       finished_at = CASE WHEN $3 THEN now() ELSE finished_at END
			 WHERE key = $1 AND status IN ('pending', 'running') RETURNING key
		)
		INSERT INTO stepwise_event (subject, kind, to_state, actor, token, attempt, detail)
		SELECT key, CASE WHEN $3 THEN 'run.finish' ELSE 'run.step_error' END, CASE WHEN $3 THEN 'failed' END,
		       $4, $5, $6, jsonb_build_object('error', $2::text) FROM r`,
		a.key, truncate(&msg), dead, a.lease.Owner, a.lease.Token, a.job.Attempt); err != nil {
		e.logger.ErrorContext(ctx, "stepwise: recording step error", "run", a.key, "error", err)
	}
	_ = e.store.Release(cctx, a.lease)
	return stepErr
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
		if err := e.store.Advance(cctx, tx, a.lease, a.lease.Cursor, &checkpoint.AdvanceOpts{Release: true}); err != nil {
			return err
		}
		_, err := tx.Exec(cctx, `
			WITH r AS (
				UPDATE stepwise_run SET status = 'cancelled', finished_at = now(), updated_at = now()
				 WHERE key = $1 AND status IN ('pending', 'running') RETURNING key, last_error
			)
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, token, attempt, detail)
			SELECT key, 'run.finish', 'running', 'cancelled', $2, $3, $4, jsonb_build_object('reason', last_error) FROM r`,
			a.key, a.lease.Owner, a.lease.Token, a.job.Attempt)
		return err
	})
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
	if _, err := e.pool.Exec(cctx, `
		WITH r AS (
			UPDATE stepwise_run SET status = 'failed', last_error = $2, finished_at = now(), updated_at = now()
			 WHERE key = $1 AND status IN ('pending', 'running') RETURNING key
		)
		INSERT INTO stepwise_event (subject, kind, to_state, actor, token, attempt, detail)
		SELECT key, 'run.finish', 'failed', $3, $4, $5, jsonb_build_object('error', $2::text) FROM r`,
		a.key, truncate(&msg), a.lease.Owner, a.lease.Token, a.job.Attempt); err != nil {
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
		_, err := tx.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, river_job_id) VALUES ($1, $2, $3, $4)
			ON CONFLICT (key) DO NOTHING`, key, job.Kind, job.EncodedArgs, job.ID)
		return err
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

func jitter(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(max)))
}
