package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepwise-go/stepwise/internal/runwait"
)

// This file is the one place a stepwise_run row changes state. Every transition is a single
// statement that updates the run only if it is still in the state the caller saw (its status,
// the River job delivering it, and where it matters the checkpoint's token and lease), and
// writes its stepwise_event in the same statement, so the audit trail and the row cannot
// disagree. A transition whose guard no longer holds changes nothing and says so
// (errRunMoved, or false), and the caller backs off: it never overwrites a decision someone
// else made meanwhile.
//
//	pending ──claim──▶ running ──release (slice end, Sleep, step error)──▶ running (released)
//	   │                  │  ╰──takeover (worker vanished: a failure)──▶ running, new job
//	   │                  ╰──finish──▶ succeeded | failed | cancelled ──resume──▶ pending
//	   ╰──────────────────────finish (cancel, job ended, crash loop)──────▶ failed | cancelled
//
//	(retrying: an unfinished run released after a failure, until its next claim; derived)
//
// The rule for released runs (issue: healthy runs taken over between slices). A worker that
// gives its lease up on purpose records released_at (and wake_at, when it is due again) in
// the same commit. River records the job's new state (snoozed, retryable) a little later, and
// until it does the job is still 'running' with an old attempted_at and no lease, which is
// what a vanished worker looks like too. Maintenance therefore leaves a run released by its
// current attempt alone for two Leases past released_at (unleasedGrace: a starved live
// process can take longer than one to have River record the snooze). If the job is still
// 'running' after that, the process died between releasing and River recording it, and the
// run is taken over (bounded: released_at + 2 × Lease + MaintenanceInterval), under a new job
// scheduled at wake_at, so a Sleep still holds to its wake time.
//
// The rule for counting failures (issue: a chaos soak failed a run that had committed 6,676
// steps as "a crash loop" because its workers were killed 25 times). failures counts the
// failures (takeovers of a vanished worker, step errors) recorded since the run last made
// progress: each transition that records one compares the checkpoint's committed steps with
// failed_at_steps, the steps when the previous failure was recorded, in the same statement,
// and restarts the count at 1 if the run committed steps in between (failureCountSQL). A
// poison run (an item that kills the worker, a step that always errors) commits nothing
// between failures and still fails after its job's MaxAttempts failures in a row; a long run
// on flaky machines, progressing between crashes, does not. Nothing is read or written per
// step for this: only the transition that records a failure reads the checkpoint's steps.

// The rule for a run waiting for a retry (issue: a crash-looping run was invisible for weeks:
// between its tries it said 'running' though no worker held it). A run is retrying, a state
// derived when it is read and never stored, while it is unfinished, nobody holds its lease,
// and either it has failures in a row (failuresInARowSQL: failures recorded since it last
// committed a step) or its River job waits for River's retry of an error. Its next try is the
// job's scheduled_at; its budget the job's max attempts. Nothing is written for it: the
// failure that starts it and the claim that ends it are the transitions above.

// failuresInARowSQL is a run's failures while they are still in a row: the checkpoint's
// committed steps are those at the last failure (failed_at_steps), so the next failure would
// add to them (failureCountSQL); 0 once the run committed a step since. r is stepwise_run,
// c its stepwise_checkpoint (may be missing).
const failuresInARowSQL = `(CASE WHEN r.failures > 0 AND r.failed_at_steps = coalesce(c.steps, 0) THEN r.failures ELSE 0 END)`

// retryingSQL is whether a run waits for a retry (the rule above); j is the run's river_job
// (may be missing: never NULL for that).
const retryingSQL = `(r.status IN ('pending', 'running') AND (c.lease_until IS NULL OR c.lease_until <= now())
	AND (` + failuresInARowSQL + ` > 0 OR coalesce(j.state = 'retryable', false)))`

// retryColumnsSQL are the derived columns a run reader scans after the stored ones
// (scanRetry): failures in a row, retrying, next try, budget and the error to show. The error
// is the run's last_error, or River's last error of the job when the run has no failures in a
// row (an error outside the steps, which is not recorded on the run).
const retryColumnsSQL = failuresInARowSQL + `, ` + retryingSQL + `,
	CASE WHEN j.state IN ('retryable', 'scheduled', 'available', 'pending') THEN j.scheduled_at END, j.max_attempts,
	CASE WHEN ` + failuresInARowSQL + ` = 0 AND j.state = 'retryable' THEN j.errors[array_length(j.errors, 1)]->>'error' ELSE r.last_error END`

// retryCandidatesSQL are the keys of the runs that may be retrying, each part driven by an
// index: unfinished runs with failures (stepwise_run_failing_idx, migration 009: only those
// rows, however many runs are pending), and the runs of River's retryable jobs (River's state
// index, then stepwise_run_job_idx).
const retryCandidatesSQL = `
	SELECT key FROM stepwise_run WHERE status IN ('pending', 'running') AND failures > 0
	UNION
	SELECT r.key FROM river_job j JOIN stepwise_run r ON r.river_job_id = j.id AND r.status IN ('pending', 'running')
	 WHERE j.state = 'retryable'`

// RunStatus is the status of a run as stored in stepwise_run.status.
type RunStatus string

// Run statuses.
const (
	RunStatusPending   RunStatus = "pending"
	RunStatusRunning   RunStatus = "running"
	RunStatusSucceeded RunStatus = "succeeded"
	RunStatusFailed    RunStatus = "failed"
	RunStatusCancelled RunStatus = "cancelled"
)

// Finished reports whether s is a final status (succeeded, failed or cancelled).
func (s RunStatus) Finished() bool {
	return s == RunStatusSucceeded || s == RunStatusFailed || s == RunStatusCancelled
}

// errRunMoved is returned by a transition whose guard no longer holds: the run finished, or
// another job now delivers it, since the caller looked.
var errRunMoved = errors.New("workflow: the run changed state meanwhile (finished, or taken over by another job)")

// dbtx is a pool, connection or transaction.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// changed runs a transition statement that ends in "SELECT count(*) FROM r" and reports
// whether it moved the run.
func changed(ctx context.Context, q dbtx, sql string, args ...any) (bool, error) {
	var n int
	if err := q.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return false, err
	}
	return n > 0, nil
}

// recordFenced audits a commit the fence refused: the run does not change (another attempt
// owns it), but the zombie's attempt is in the trail. Best effort: the refusal already holds.
func recordFenced(ctx context.Context, q execer, key string, by stepActor, cause error) {
	_, _ = q.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, token, attempt, detail)
		VALUES ($1, 'lease.fenced', $2, $3, $4, jsonb_build_object('error', $5::text))`,
		key, by.owner, by.token, by.attempt, cause.Error())
}

// insertRunForJob creates the run of a job inserted with plain River Insert (args with a
// RunKey method), linked to that job. Guards: two workers creating the same run (ON
// CONFLICT: the first one wins, the second reads it).
func insertRunForJob(ctx context.Context, tx pgx.Tx, key, kind string, input []byte, jobID int64) error {
	_, err := tx.Exec(ctx, `
		WITH r AS (
			INSERT INTO stepwise_run (key, workflow, input, river_job_id) VALUES ($1, $2, $3, $4)
			ON CONFLICT (key) DO NOTHING RETURNING key
		)
		INSERT INTO stepwise_event (subject, kind, to_state, detail)
		SELECT key, 'run.start', 'pending', jsonb_build_object('river_job_id', $4::bigint) FROM r`,
		key, kind, input, jobID)
	return err
}

// markRunning records a claim by jobID: the run is running, one more claim counted, and any
// release of an earlier attempt forgotten. Guards: a job that no longer delivers the run
// (taken over meanwhile) or a run that finished; then it returns false and the attempt must
// give its lease back and exit. The lease.claim event is written by the claim itself; this
// writes run.running only when the run leaves pending.
func markRunning(ctx context.Context, q dbtx, key string, jobID int64) (bool, error) {
	return changed(ctx, q, `
		WITH before AS (
			SELECT status FROM stepwise_run WHERE key = $1
		), r AS (
			UPDATE stepwise_run SET status = 'running', attempts = attempts + 1, released_at = NULL, wake_at = NULL,
			       awaits_cursor_version = NULL, awaits_since = NULL, river_job_id = $2, updated_at = now()
			 WHERE key = $1 AND status IN ('pending', 'running') AND (river_job_id = $2 OR river_job_id IS NULL)
			RETURNING key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, detail)
			SELECT r.key, 'run.running', 'pending', 'running', jsonb_build_object('river_job_id', $2::bigint)
			  FROM r, before WHERE before.status = 'pending'
		)
		SELECT count(*) FROM r`, key, jobID)
}

// stepActor says who moves a run from inside a worker, for the audit trail.
type stepActor struct {
	owner   string
	token   int64
	attempt int
	jobID   int64
}

// markReleased records, in the step's own transaction, that the worker gives the lease up
// on purpose and when the run is due again (nil: at once). Guards: a run that was taken over
// or finished meanwhile (errRunMoved rolls the step back). See the rule at the top.
func markReleased(ctx context.Context, tx pgx.Tx, key string, by stepActor, reason string, wakeAt *time.Time) error {
	ok, err := changed(ctx, tx, `
		WITH r AS (
			UPDATE stepwise_run SET released_at = clock_timestamp(), wake_at = $3, updated_at = now()
			 WHERE key = $1 AND status = 'running' AND river_job_id = $2 RETURNING key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, actor, token, attempt, detail)
			SELECT key, 'run.release', $4, $5, $6, jsonb_strip_nulls(jsonb_build_object('reason', $7::text, 'wake_at', $3::timestamptz)) FROM r
		)
		SELECT count(*) FROM r`, key, by.jobID, wakeAt, by.owner, by.token, by.attempt, reason)
	if err == nil && !ok {
		err = errRunMoved
	}
	return err
}

// failureCount is the failures a run has once one more is recorded, given the checkpoint's
// committed steps now (steps) and the run's columns: failures in a row since the run last made
// progress, so 1 again when it committed steps since the last failure was recorded.
func failureCount(failures int, failedAtSteps, steps int64) int {
	if steps != failedAtSteps {
		return 1
	}
	return failures + 1
}

// failureCountSQL is failureCount in SQL, for the UPDATE of stepwise_run that records the
// failure, with the checkpoint's steps as c.steps (and failures, failed_at_steps the run's
// values before the update). The same statement sets failed_at_steps = c.steps.
const failureCountSQL = `(CASE WHEN c.steps <> stepwise_run.failed_at_steps THEN 1 ELSE stepwise_run.failures + 1 END)`

// checkpointStepsSQL is a CTE "c" with the run's committed steps (0 before its first claim).
const checkpointStepsSQL = `c AS (SELECT coalesce((SELECT steps FROM stepwise_checkpoint WHERE key = $1), 0) AS steps)`

// markStepError records a step that did not commit: one more failure for the crash-loop
// guard (failures in a row without progress, see failureCountSQL), the error, and the release
// (River retries after its backoff). The run ends failed when its failures reach maxFailures
// — never because River's attempts ran out: on the job's last attempt the worker snoozes a
// run that is not failed here (see attempt.stepFailed).
// Guards: a run taken over or finished meanwhile (then nothing is recorded). It returns the
// run's status and its failures in a row afterwards. wake_at is kept: the claim cleared it,
// so it is set only when this attempt's Sleep committed after all (a COMMIT whose answer was
// lost), and that Sleep still holds (the worker snoozes a job delivered before it).
func markStepError(ctx context.Context, q dbtx, key string, by stepActor, msg string, maxFailures int) (RunStatus, int, error) {
	var (
		status   RunStatus
		failures int
	)
	err := q.QueryRow(ctx, `
		WITH `+checkpointStepsSQL+`, r AS (
			UPDATE stepwise_run
			   SET failures = `+failureCountSQL+`, failed_at_steps = c.steps,
			       last_error = CASE WHEN `+failureCountSQL+` >= $4
			                         THEN 'failed after ' || `+failureCountSQL+` || ' failures in a row without progress (the job''s max attempts): ' || $3
			                         ELSE $3 END,
			       released_at = clock_timestamp(), updated_at = now(),
			       status      = CASE WHEN `+failureCountSQL+` >= $4 THEN 'failed' ELSE status END,
			       finished_at = CASE WHEN `+failureCountSQL+` >= $4 THEN clock_timestamp() ELSE finished_at END
			  FROM c
			 WHERE key = $1 AND status IN ('pending', 'running') AND river_job_id = $2
			RETURNING key, status, failures, c.steps
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, token, attempt, detail)
			SELECT key, CASE WHEN status = 'failed' THEN 'run.finish' ELSE 'run.step_error' END, 'running',
			       CASE WHEN status = 'failed' THEN 'failed' END, $5, $6, $7,
			       jsonb_build_object('error', $3::text, 'failures', failures, 'steps', steps) FROM r
		)
		SELECT status, failures FROM r`, key, by.jobID, msg, maxFailures, by.owner, by.token, by.attempt).Scan(&status, &failures)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, errRunMoved
	}
	return status, failures, err
}

// A run's finished_at is the clock when its ending statement runs (clock_timestamp), not when
// its transaction began (now()): a step's transaction begins before the user's code, which
// may take minutes, and a parent's resume compares its descendants' ends with its own
// (resumeDescendants). Guards against: a child that failed after its parent ended dated
// before it, and resumed with the parent unseen.
//
// finishByWorker ends a run from its worker: succeeded or failed in the step's transaction,
// cancelled or failed terminally on their own. Guards: a run that another actor finished
// (maintenance failed it) or took over meanwhile; errRunMoved then rolls the step back, so a
// failed run never flips to succeeded.
func finishByWorker(ctx context.Context, q pgx.Tx, key string, by stepActor, to RunStatus, lastError *string, steps int64) error {
	ok, err := changed(ctx, q, `
		WITH r AS (
			UPDATE stepwise_run SET status = $3, last_error = coalesce($4, last_error), finished_at = clock_timestamp(), updated_at = now(),
			       released_at = NULL, wake_at = NULL
			 WHERE key = $1 AND status IN ('pending', 'running') AND river_job_id = $2 RETURNING key, last_error
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, token, attempt, detail)
			SELECT key, 'run.finish', 'running', $3, $5, $6, $7,
			       jsonb_strip_nulls(jsonb_build_object('steps', $8::bigint, 'error', last_error)) FROM r
		)
		SELECT count(*) FROM r`, key, by.jobID, string(to), truncate(lastError), by.owner, by.token, by.attempt, steps)
	if err != nil {
		return fmt.Errorf("finishing run %q as %s: %w", key, to, err)
	}
	if !ok {
		return fmt.Errorf("finishing run %q as %s: %w", key, to, errRunMoved)
	}
	// A parent waiting for its children wakes with this commit (wait.go).
	return runwait.AfterChildFinished(ctx, q, key)
}

// execer is the write side of a pool, connection or transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// requestCancel records CancelRun. Guards: a finished run (nothing to cancel; no event).
// The request reaches the run's unfinished descendants (Step.StartChild) in the same
// statement, each with the reason and the run it came from.
func requestCancel(ctx context.Context, q execer, key, reason string) error {
	_, err := q.Exec(ctx, `
		WITH RECURSIVE tree AS (
			-- A finished run is not cancelled, and neither are its descendants through it:
			-- cancelling a finished run does nothing.
			SELECT $1::text AS key WHERE EXISTS (SELECT 1 FROM stepwise_run WHERE key = $1 AND status IN ('pending', 'running'))
			UNION
			SELECT c.key FROM stepwise_run c JOIN tree t ON c.parent_key = t.key
		), r AS (
			UPDATE stepwise_run SET cancel_requested_at = coalesce(cancel_requested_at, now()),
			       last_error = CASE WHEN key = $1 THEN $2 ELSE 'cancelled with its parent run ' || $1 || ': ' || $2 END, updated_at = now()
			 WHERE key IN (SELECT key FROM tree) AND status IN ('pending', 'running') RETURNING key
		)
		INSERT INTO stepwise_event (subject, kind, detail)
		SELECT key, 'run.cancel_requested', jsonb_strip_nulls(jsonb_build_object('reason', $2::text, 'with_parent', CASE WHEN key <> $1 THEN $1 END)) FROM r`,
		key, reason)
	return err
}

// seenRun is what maintenance saw of a run when it decided to act on it; its transitions
// hold only if all of it still holds.
type seenRun struct {
	key           string
	jobID         *int64
	token         int64
	steps         int64 // the checkpoint's committed steps
	failures      int
	failedAtSteps int64
}

// failuresNext is the run's failures once one more is recorded, as seen (failureCount).
func (s seenRun) failuresNext() int { return failureCount(s.failures, s.failedAtSteps, s.steps) }

// lockLapsed locks the run's checkpoint row if its token and committed steps are still the
// ones seen and its lease is still lapsed, so no claim, renewal or commit can slip between
// maintenance's decision and its commit (a commit since the scan is progress: it changes
// what the crash-loop guard counts). With fence it also moves the token on, so a worker that would renew or commit
// later (a zombie of the run being failed or cancelled) is refused. Guards: maintenance
// acting on a run whose worker renewed (or that someone claimed) after the scan.
func lockLapsed(ctx context.Context, tx pgx.Tx, s seenRun, fence bool) (bool, error) {
	if fence {
		return changed(ctx, tx, `
			WITH c AS (
				UPDATE stepwise_checkpoint SET fencing_token = fencing_token + 1, owner = NULL, lease_until = NULL, updated_at = now()
				 WHERE key = $1 AND fencing_token = $2 AND steps = $3 AND (lease_until IS NULL OR lease_until < clock_timestamp())
				RETURNING key
			)
			SELECT count(*) FROM c`, s.key, s.token, s.steps)
	}
	return changed(ctx, tx, `
		WITH c AS (
			SELECT key FROM stepwise_checkpoint
			 WHERE key = $1 AND fencing_token = $2 AND steps = $3 AND (lease_until IS NULL OR lease_until < clock_timestamp())
			   FOR UPDATE
		)
		SELECT count(*) FROM c`, s.key, s.token, s.steps)
}

// takeOver moves a run to a new job after its worker vanished, counting the crash (in a row
// since the run last made progress: failureCountSQL). Guards: two maintenance passes
// re-enqueueing the same run (compare-and-set on the job id and the failures seen), and a run
// that finished meanwhile. The caller has locked the checkpoint (lockLapsed), so its steps
// are the ones seen.
//
// The event records the River client that had last fetched the old job, and when, as the
// decision saw them (fetched_by, fetched_at). Guards against: an audit that names the wrong
// process. The old job lives on after the takeover, and once its frozen fetcher wakes and
// snoozes it another process fetches it to find it superseded, so River's attempted_by read
// later ends with a process that never held the run (a chaos run blamed a live worker for a
// takeover that answered a SIGSTOPped one).
func takeOver(ctx context.Context, tx pgx.Tx, s seenRun, newJob int64, why string, wakeAt *time.Time, fetchedBy *string, fetchedAt *time.Time) (bool, error) {
	return changed(ctx, tx, `
		WITH `+checkpointStepsSQL+`, r AS (
			UPDATE stepwise_run SET river_job_id = $3, failures = `+failureCountSQL+`, failed_at_steps = c.steps,
			       released_at = NULL, updated_at = now()
			  FROM c
			 WHERE key = $1 AND river_job_id IS NOT DISTINCT FROM $2 AND status IN ('pending', 'running') AND failures = $4
			RETURNING key, failures, c.steps
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, actor, detail)
			SELECT key, 'run.takeover', 'maintenance', jsonb_strip_nulls(jsonb_build_object('old_job', $2::bigint, 'new_job', $3::bigint,
			       'failures', failures, 'steps', steps, 'reason', $5::text, 'wake_at', $6::timestamptz,
			       'fetched_by', $7::text, 'fetched_at', $8::timestamptz)) FROM r
		)
		SELECT count(*) FROM r`, s.key, s.jobID, newJob, s.failures, why, wakeAt, fetchedBy, fetchedAt)
}

// finishByMaintenance ends a run nobody is working: failed (its job ended without finishing
// it, or its crashes used up its attempts) or cancelled (CancelRun on a run that sleeps or
// waits for a retry). Failing records one more failure by the same rule as takeOver
// (failureCountSQL). Guards: a run taken over or finished meanwhile, and when failing, a run
// whose failures changed since they were seen (a step error recorded meanwhile: the decision
// was made on the count seen). The caller has fenced the checkpoint with
// lockLapsed(fence=true) in the same transaction, so its steps are the ones seen.
func finishByMaintenance(ctx context.Context, tx pgx.Tx, s seenRun, to RunStatus, reason string) (bool, error) {
	ok, err := changed(ctx, tx, `
		WITH before AS (
			SELECT status FROM stepwise_run WHERE key = $1
		), `+checkpointStepsSQL+`, r AS (
			UPDATE stepwise_run SET status = $3, last_error = $4, finished_at = clock_timestamp(), updated_at = now(),
			       failures        = CASE WHEN $3 = 'failed' THEN `+failureCountSQL+` ELSE failures END,
			       failed_at_steps = CASE WHEN $3 = 'failed' THEN c.steps ELSE failed_at_steps END
			  FROM c
			 WHERE key = $1 AND river_job_id IS NOT DISTINCT FROM $2 AND status IN ('pending', 'running')
			   AND ($3 <> 'failed' OR failures = $5)
			RETURNING key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
			SELECT r.key, 'run.finish', before.status, $3, 'maintenance', jsonb_build_object('error', $4::text) FROM r, before
		)
		SELECT count(*) FROM r`, s.key, s.jobID, string(to), reason, s.failures)
	if err != nil || !ok {
		return ok, err
	}
	// A parent waiting for its children wakes with this commit (wait.go).
	return true, runwait.AfterChildFinished(ctx, tx, s.key)
}

// resumeRun puts a failed or cancelled run back to pending under a new job, from its last
// committed cursor (the checkpoint is untouched), with a fresh crash-loop budget. Guards: a
// run that is not failed or cancelled (a succeeded run is never redone; a live one is not
// doubled), two resumes at once (the status moves on the first), and a run that moved since
// it was read and came back to the same status (its version moved).
func resumeRun(ctx context.Context, tx pgx.Tx, key string, from RunStatus, version, newJob int64, actor, reason string, parent *withParent, left []string) (bool, error) {
	// The event records the version the person saw: the run's own, or, for a descendant
	// resumed with its parent, the parent's (the person never saw the descendant's).
	var parentKey *string
	var parentSeen *int64
	if parent != nil {
		parentKey, parentSeen = &parent.key, &parent.seenVersion
	}
	return changed(ctx, tx, `
		WITH r AS (
			UPDATE stepwise_run SET status = 'pending', river_job_id = $3, failures = 0, last_error = NULL,
			       finished_at = NULL, cancel_requested_at = NULL, released_at = NULL, wake_at = NULL,
			       awaits_cursor_version = NULL, awaits_since = NULL, updated_at = now()
			 WHERE key = $1 AND status = $2 AND version = $6 RETURNING key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
			SELECT key, 'run.resume', $2, 'pending', $4, jsonb_strip_nulls(jsonb_build_object('reason', $5::text, 'new_job', $3::bigint,
			       'seen_version', CASE WHEN $7::text IS NULL THEN $6::bigint END,
			       'with_parent', $7::text, 'parent_seen_version', $8::bigint,
			       'left_as_they_are', CASE WHEN cardinality($9::text[]) > 0 THEN to_jsonb($9::text[]) END)) FROM r
		)
		SELECT count(*) FROM r`, key, string(from), newJob, actor, reason, version, parentKey, parentSeen, left)
}

// withParent is the resume a descendant is resumed with: the run the person resumed, at the
// version they saw.
type withParent struct {
	key         string
	seenVersion int64
}
