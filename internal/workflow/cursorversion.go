package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/internal/jitter"
)

// Rolling deploys (docs/design.md, *Rolling deploys and cursor versions*). A run's cursor is
// data committed by one binary and read by another, and during a rolling restart old and new
// workers take the same runs in turn. A stepper declares the version of its cursor's shape;
// the version is committed with every cursor (checkpoint.AdvanceOpts.CursorVersion). At the
// claim a worker compares the committed version with the one its stepper reads:
//
//   - the same: decoded strictly, as always;
//   - older: upgraded by the stepper (CursorUpgrader), and committed in the new version by
//     the next step; no upgrade for it is a terminal failure naming both versions and the fix;
//   - newer: the run is released untouched for a worker that reads it (awaitNewerWorker):
//     no failure recorded, no failure budget spent, no River attempt used (a snooze gives its
//     attempt back), no takeover, and the run shows what it waits for (Run.Awaiting).

// CursorVersioner is implemented by a Stepper that declares the version of its cursor's
// shape. StepperDefaults declares 1. Raise it when a new release changes the cursor in a way
// the previous release cannot read (a field renamed, removed, or given another meaning), and
// implement CursorUpgrader for the versions it replaces.
type CursorVersioner interface {
	CursorVersion() int
}

// CursorUpgrader is implemented by a Stepper whose CursorVersion is above 1, to read cursors
// that older releases committed. UpgradeCursor is given the committed version (from, below
// the stepper's CursorVersion) and the cursor as committed (raw JSON, never empty: a run with
// no committed cursor starts from the zero cursor in every version), and returns the cursor
// in the stepper's version; the next step commits it in that version. It must be pure: it
// may run once per claim until that commit. StepperDefaults' UpgradeCursor upgrades nothing
// (ErrNoCursorUpgrade).
type CursorUpgrader[C any] interface {
	UpgradeCursor(from int, raw json.RawMessage) (C, error)
}

// ErrNoCursorUpgrade is what StepperDefaults' UpgradeCursor returns, and what an UpgradeCursor
// returns (wrapped) for a version it cannot read: the run fails, naming the versions, with
// its cursor kept for a resume once a binary that reads it is deployed.
var ErrNoCursorUpgrade = errors.New("no upgrade for this cursor version")

// CursorVersion returns 1: the cursor's shape has not changed since the stepper was written.
func (StepperDefaults[A, C]) CursorVersion() int { return 1 }

// UpgradeCursor upgrades nothing: it returns ErrNoCursorUpgrade.
func (StepperDefaults[A, C]) UpgradeCursor(from int, _ json.RawMessage) (C, error) {
	var c C
	return c, fmt.Errorf("%w (version %d)", ErrNoCursorUpgrade, from)
}

// cursorVersionOf is the version of the cursor w reads and writes: 1 unless it declares one.
func cursorVersionOf(w any) int {
	if v, ok := w.(CursorVersioner); ok {
		return v.CursorVersion()
	}
	return 1
}

// checkCursorVersioning refuses, at AddWorker, a stepper whose versioning would misbehave
// only once a deploy meets an older or newer cursor: a version below 1, or an UpgradeCursor
// whose signature does not match the cursor type (it would silently never be called).
func checkCursorVersioning[A river.JobArgs, C any](w Stepper[A, C]) error {
	var a A
	if v := cursorVersionOf(w); v < 1 {
		return fmt.Errorf("stepwise.AddWorker(%s): CursorVersion() of %T is %d; versions start at 1 (StepperDefaults gives 1)", a.Kind(), w, v)
	}
	if _, ok := w.(CursorUpgrader[C]); !ok {
		if _, has := reflect.TypeOf(w).MethodByName("UpgradeCursor"); has {
			var c C
			return fmt.Errorf("stepwise.AddWorker(%s): %T has an UpgradeCursor method, but not UpgradeCursor(from int, raw json.RawMessage) (%T, error) for its cursor type, so it would never be called",
				a.Kind(), w, c)
		}
	}
	return nil
}

// Awaiting says what a run waits for while no worker that reads its committed cursor has
// taken it: a worker of an older release met the cursor and released the run untouched.
type Awaiting struct {
	// CursorVersion is the version of the run's committed cursor, which a worker must read.
	CursorVersion int `json:"cursor_version"`
	// Since is when the first such worker released the run.
	Since time.Time `json:"since"`
}

// String says it for a person: "waiting for a worker that reads cursor version 2".
func (w *Awaiting) String() string {
	return fmt.Sprintf("waiting for a worker that reads cursor version %d (since %s)", w.CursorVersion, w.Since.UTC().Format(time.RFC3339))
}

// awaitingColumnsSQL are the run's Awaiting columns (scanRun), read only while the run is
// unfinished: a run cancelled while it waited waits for nothing.
const awaitingColumnsSQL = `, CASE WHEN r.status IN ('pending', 'running') THEN r.awaits_cursor_version END, r.awaits_since`

// scanAwaiting builds Run.Awaiting from awaitingColumnsSQL.
func scanAwaiting(version *int, since *time.Time) *Awaiting {
	if version == nil || since == nil {
		return nil
	}
	return &Awaiting{CursorVersion: *version, Since: *since}
}

// The back-off of a run released for a newer worker: half the time it has waited so far,
// within these bounds. An old worker that meets the run again releases it again, later each
// time, so a long deploy costs a claim and a release per run every awaitRetryMax at most,
// and a run comes back within half its wait (or awaitRetryMax) of the first new worker.
const (
	awaitRetryMin = time.Second
	awaitRetryMax = 15 * time.Second
	// awaitWarnAfter is how long a run waits before its releases are logged as a warning: a
	// deploy that should have brought a worker that reads it by now.
	awaitWarnAfter = time.Minute
)

func awaitBackoff(waited time.Duration) time.Duration {
	return jitter.Spread(min(max(waited/2, awaitRetryMin), awaitRetryMax), 0.1)
}

// admitCursor decides, right after the claim, what this attempt does with the committed
// cursor: go on (stop false; a.lease.Cursor then holds a cursor of the stepper's version), or
// stop the attempt with err for River (stop true). endClaim ends the claim's span.
func (a *attempt[A, C]) admitCursor(ctx context.Context, run *Run, endClaim func(outcome string, err error)) (stop bool, err error) {
	e := a.sw.e
	if run.CancelRequestedAt != nil {
		// A cancellation does not read the cursor (finishCancelled commits it as it is, in its
		// version): no reason to wait for a newer worker, or fail on a cursor this one cannot read.
		return false, nil
	}
	raw := a.lease.Cursor
	committed, reads := max(a.lease.CursorVersion, 1), cursorVersionOf(a.sw.w)
	empty := len(raw) == 0 || bytes.Equal(raw, []byte("null"))
	switch {
	case committed > reads && !empty:
		endClaim("awaiting_newer_worker", nil)
		return true, a.awaitNewerWorker(ctx, run, committed, reads)
	case committed < reads && !empty:
		c, err := a.upgradeCursor(committed, raw)
		if err != nil {
			err = fmt.Errorf("run %q: its committed cursor is version %d and %T reads version %d, with no upgrade from version %d: %w; "+
				"teach UpgradeCursor version %d (or deploy a release that reads it), then resume the run (stepwise.Client.RunResume) from its cursor, which is kept in stepwise_checkpoint: %s",
				a.key, committed, a.sw.w, reads, committed, err, committed, raw)
			endClaim("undecodable_cursor", err)
			return true, a.failTerminal(ctx, err)
		}
		enc, err := json.Marshal(c)
		if err != nil {
			err = fmt.Errorf("run %q: encoding the cursor %T upgraded from version %d: %w", a.key, c, committed, err)
			endClaim("undecodable_cursor", err)
			return true, a.failTerminal(ctx, err)
		}
		// The lease now holds the cursor in the stepper's version: each step decodes it, and
		// the next commit writes it with that version.
		a.lease.Cursor, a.lease.CursorVersion = enc, reads
		e.logger.InfoContext(ctx, "stepwise: cursor upgraded; the next step commits it in the new version",
			"run", a.key, "workflow", a.job.Kind, "from_cursor_version", committed, "cursor_version", reads)
	}
	if err := a.decodeCursor(a.lease.Cursor); err != nil {
		if committed == reads {
			err = fmt.Errorf("%w (cursor version %d: if the cursor's shape changed, declare a higher CursorVersion and an UpgradeCursor from this one)", err, committed)
		}
		endClaim("undecodable_cursor", err)
		return true, a.failTerminal(ctx, err)
	}
	if run.Awaiting != nil {
		e.logger.InfoContext(ctx, "stepwise: a worker that reads the run's cursor took it after it waited",
			"run", a.key, "workflow", a.job.Kind, "cursor_version", run.Awaiting.CursorVersion, "waited", time.Since(run.Awaiting.Since).Round(time.Millisecond))
	}
	return false, nil
}

// upgradeCursor asks the stepper for the cursor in its version. A panic in UpgradeCursor is
// its error: the worker process must not die with the lease held.
func (a *attempt[A, C]) upgradeCursor(from int, raw json.RawMessage) (c C, err error) {
	up, ok := a.sw.w.(CursorUpgrader[C])
	if !ok {
		return c, fmt.Errorf("%w (the stepper has no UpgradeCursor)", ErrNoCursorUpgrade)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("UpgradeCursor panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return up.UpgradeCursor(from, append(json.RawMessage(nil), raw...))
}

// awaitNewerWorker releases a run whose committed cursor is newer than this worker reads,
// without touching it, and snoozes the job for a worker that reads it.
//
// Release rather than fail: the cursor is fine, this worker is old. A rolling deploy has new
// workers arriving; failing would end runs (or spend their failure budget) for a state that
// cures itself. Not a step error either: that counts toward the budget and River's attempts.
// The lease is released in the same transaction that records the wait, so the next claim
// (a new worker's) need not wait for it to lapse; released_at and wake_at are set as for any
// release on purpose, so maintenance does not mistake the gap before River records the
// snooze for a dead worker (and keeps the wake time should this process die in it).
func (a *attempt[A, C]) awaitNewerWorker(ctx context.Context, run *Run, committed, reads int) error {
	e := a.sw.e
	var waited time.Duration
	if run.Awaiting != nil {
		waited = max(time.Since(run.Awaiting.Since), 0)
	}
	retryIn := awaitBackoff(waited)
	wakeAt := time.Now().Add(retryIn)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var released, recorded bool
	err := pgx.BeginFunc(cctx, e.pool, func(tx pgx.Tx) error {
		var err error
		// Guards: a lease that lapsed and was claimed by another attempt while this one
		// looked (fenced: nothing released, nothing recorded).
		if released, err = e.store.ReleaseIn(cctx, tx, a.lease); err != nil || !released {
			return err
		}
		recorded, err = markAwaiting(cctx, tx, a.key, a.actor(), committed, reads, wakeAt)
		return err
	})
	if err != nil {
		// Nothing committed: the lease is still ours. Give it back and let River retry the
		// attempt (an error outside the steps: not a failure of the run).
		_ = e.store.Release(cctx, a.lease)
		return fmt.Errorf("releasing run %q for a worker that reads cursor version %d: %w", a.key, committed, err)
	}
	if !released || !recorded {
		// Guards: a run taken over, finished or claimed elsewhere since it was read; this job's
		// work on it is over (the lease, if it was still ours, is released).
		e.logger.InfoContext(ctx, "stepwise: run moved on before this job could release it for a newer worker, exiting", "run", a.key, "job", a.job.ID)
		return nil
	}
	e.metrics.awaitReleases.WithLabelValues(a.job.Kind).Inc()
	level := e.logger.InfoContext
	if waited >= awaitWarnAfter {
		level = e.logger.WarnContext
	}
	level(ctx, "stepwise: run's committed cursor is newer than this worker reads; released untouched for a worker that reads it",
		"run", a.key, "workflow", a.job.Kind, "job", a.job.ID, "cursor_version", committed, "reads_cursor_version", reads,
		"waiting", waited.Round(time.Millisecond), "retry_in", retryIn.Round(time.Millisecond))
	return river.JobSnooze(retryIn)
}

// markAwaiting records, with the release of the lease, that the run waits for a worker that
// reads cursor version `committed`, and when it is due again. The wait's start is kept across
// the releases of one wait (the back-off grows with it); markRunning and resumeRun end it.
// Guards: a run taken over or finished since it was read (false: nothing recorded).
func markAwaiting(ctx context.Context, tx pgx.Tx, key string, by stepActor, committed, reads int, wakeAt time.Time) (bool, error) {
	return changed(ctx, tx, `
		WITH r AS (
			UPDATE stepwise_run SET awaits_cursor_version = $3,
			       awaits_since = CASE WHEN awaits_cursor_version IS NULL OR awaits_since IS NULL THEN clock_timestamp() ELSE awaits_since END,
			       released_at = clock_timestamp(), wake_at = $4, river_job_id = $2, updated_at = now()
			 WHERE key = $1 AND status IN ('pending', 'running') AND (river_job_id = $2 OR river_job_id IS NULL)
			RETURNING key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, actor, token, attempt, detail)
			SELECT key, 'run.release', $5, $6, $7, jsonb_build_object('reason', 'cursor_version', 'cursor_version', $3::int,
			       'reads_cursor_version', $8::int, 'wake_at', $4::timestamptz) FROM r
		)
		SELECT count(*) FROM r`, key, by.jobID, committed, wakeAt, by.owner, by.token, by.attempt, reads)
}
