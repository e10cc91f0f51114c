package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/audittext"
	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/pgtx"
	"github.com/stepwise-go/stepwise/internal/runstart"
	"github.com/stepwise-go/stepwise/internal/runwait"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// metadataRunKey is the River job metadata field that names the run a job delivers. Keeping
// the key in metadata leaves the user's job args exactly as they wrote them.
const metadataRunKey = runwait.MetadataRunKey

// metadataTraceParent is the River job metadata field holding the W3C traceparent of the span
// that queued the job (a start or a takeover). Its own name, not River's otelriver
// "traceparent", so that both can be used side by side.
const metadataTraceParent = runwait.MetadataTraceParent

// RunKeyer may be implemented by job args to give jobs inserted with plain River Insert
// (without Start) a run key.
type RunKeyer interface {
	RunKey() string
}

// Run is a run of a step function as stored in stepwise_run.
type Run struct {
	Key        string
	Workflow   string
	Input      json.RawMessage
	Status     RunStatus
	Schedule   *string
	Slot       *time.Time
	Shard      *int
	RiverJobID *int64
	// Attempts counts claims: one per attempt of the run's jobs, so one per slice.
	Attempts int
	// Failures counts what the crash-loop guard counts: takeovers of a worker that vanished,
	// and step errors, in a row since the run last committed a step (a failure after
	// progress restarts the count at 1). The run fails when they reach its job's MaxAttempts.
	Failures  int
	LastError *string
	// WakeAt is when a run that released its lease on purpose (Sleep, Until) is due again.
	WakeAt     *time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
	// CancelRequestedAt is when CancelRun was called, if it was.
	CancelRequestedAt *time.Time
	// Steps counts the steps the run has committed (its checkpoint's count).
	Steps int64
	// Version counts the run's status changes (1 when started). A person who resumes a
	// run passes the version they saw (stepwise.Client.RunResume, ResumeTx): a run resumed, run and failed
	// again since has another version, and another failure to read first.
	Version int64

	// FailuresInARow is Failures while they are still in a row: 0 once the run committed a
	// step after its last failure (its next failure then counts 1 again).
	FailuresInARow int
	// Retry is set while the run waits for a retry (derived when read, never stored): it is
	// unfinished, no worker holds it, and it has failures in a row or its River job waits for
	// River's retry of an error. A run whose Retry shows its failures in a row nearing
	// MaxFailures is a crash loop: its status alone says 'running' between tries.
	Retry *Retry
	// Awaiting is set while the run waits for a worker that reads its committed cursor: a
	// worker of an older release met a cursor version newer than its stepper reads and
	// released the run untouched (docs/design.md, *Rolling deploys and cursor versions*).
	// Awaiting.String() says it: "waiting for a worker that reads cursor version 2".
	Awaiting *Awaiting

	// HistoryPrunedAt is when package retention deleted the run's events (its row and
	// checkpoint stay, so the key still names this run and a failed run still resumes).
	HistoryPrunedAt *time.Time

	// Created is true when the Start call that returned this Run created it.
	Created bool

	// Parent is the run that started this one with Step.StartChild (GetRun only).
	Parent *string
	// Wait is what the run waits for, since when and what is missing, while it waits
	// (WaitForOperations, WaitForChildren, WaitForSignal); nil otherwise (GetRun only).
	Wait *WaitState
}

// Retry describes a run waiting to be tried again after failing.
type Retry struct {
	// FailuresInARow are the run's failures since it last committed a step; the run fails
	// when they reach MaxFailures. 0 when the error was outside the run's steps (a database
	// blip in a claim), which does not count.
	FailuresInARow int
	// MaxFailures is the run's budget: its River job's MaxAttempts (0 if the job is gone).
	MaxFailures int
	// NextTryAt is when River makes the run's job available again (nil while River has not
	// recorded the retry yet, or the job is gone). In the past: waiting for a free worker.
	NextTryAt *time.Time
	// LastError is the error of the last failure.
	LastError string
}

// StartOpts are options for Start and StartTx. A run started here belongs to no schedule:
// only package schedule starts runs with a schedule, slot and shard recorded (Run.Schedule,
// Run.Slot, Run.Shard), so a slot's runs are the ones its schedule started.
type StartOpts struct {
	// InsertOpts are passed to River for the run's job (queue, priority, max attempts...).
	InsertOpts *river.InsertOpts

	// TracerProvider gives the tracer of the start's span, "stepwise.start", whose context
	// rides in the job's metadata so the run's attempts link back to it. Nil means
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Start starts the run key of args's workflow in its own transaction. See StartTx.
func Start[A river.JobArgs](ctx context.Context, client *river.Client[pgx.Tx], key string, args A, opts *StartOpts) (*Run, error) {
	if client == nil {
		return nil, errors.New("starting a run: the River client is nil")
	}
	execTx, err := client.Driver().GetExecutor().Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("starting run %q: %w", key, err)
	}
	tx := client.Driver().UnwrapTx(execTx)
	defer pgtx.Rollback(ctx, tx)
	run, err := StartTx(ctx, client, tx, key, args, opts)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("starting run %q: committing: %w", key, err)
	}
	return run, nil
}

// StartTx starts a run in tx: it records the run and its checkpoint and inserts the River job
// that delivers it, all in the caller's transaction. A key names one run forever: starting
// the same key again with the same workflow and input returns the existing run (Created is
// false) and inserts no job, so "the cron fired twice" or "the caller retried" cannot start a
// second run. The same key with another workflow or input is ErrRunConflict. This holds after
// retention too: package retention never deletes a run's row, only its events.
func StartTx[A river.JobArgs](ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args A, opts *StartOpts) (*Run, error) {
	var p runstart.Params
	if opts != nil {
		p.Opts, p.TracerProvider = opts.InsertOpts, opts.TracerProvider
	}
	return startTx(ctx, client, tx, key, args, p)
}

// startTxParent is StartTx of a child run (Step.StartChild).
func startTxParent(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args river.JobArgs, opts *river.InsertOpts, parent *string) (*Run, error) {
	return startTx(ctx, client, tx, key, args, runstart.Params{Opts: opts, Parent: parent})
}

// startTx records the start (package runstart, which package schedule also starts its slots'
// runs with) and reads the run back.
func startTx(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args river.JobArgs, p runstart.Params) (*Run, error) {
	created, err := runstart.Tx(ctx, client, tx, key, args, p)
	if err != nil {
		return nil, err
	}
	run, err := GetRun(ctx, tx, key)
	if err != nil {
		return nil, err
	}
	run.Created = created
	return run, nil
}

// runKeyOf finds the run a job delivers: the key Start put in its metadata, else the args'
// RunKey method; and the traceparent of what queued the job, if its metadata carries one.
func runKeyOf(metadata []byte, args any) (key, traceParent string, err error) {
	if len(metadata) > 0 {
		var m map[string]any
		if err := json.Unmarshal(metadata, &m); err == nil {
			traceParent, _ = m[metadataTraceParent].(string)
			if k, ok := m[metadataRunKey].(string); ok && k != "" {
				return k, traceParent, nil
			}
		}
	}
	if rk, ok := args.(RunKeyer); ok {
		key := rk.RunKey()
		if err := checkpoint.ValidateKey(key); err != nil {
			return "", "", fmt.Errorf("RunKey() of %T: %w", args, err)
		}
		return key, traceParent, nil
	}
	return "", "", fmt.Errorf("job args %T carry no run key: start runs with stepwise.Client.RunStart, or give the args a RunKey() string method", args)
}

// runColumnsSQL are a run's columns with its derived retry state, read from stepwise_run r
// joined with its checkpoint c and River job j as in runJoinsSQL (scanRun).
const runColumnsSQL = `r.key, r.workflow, r.input, r.status, r.schedule, r.slot, r.shard, r.river_job_id, r.attempts, r.failures,
		r.last_error, r.wake_at, r.created_at, r.updated_at, r.finished_at, r.cancel_requested_at, r.version, r.history_pruned_at, coalesce(c.steps, 0), ` + retryColumnsSQL + awaitingColumnsSQL

const runJoinsSQL = `
	LEFT JOIN stepwise_checkpoint c ON c.key = r.key
	LEFT JOIN river_job j ON j.id = r.river_job_id`

func scanRun(row pgx.Row, extra ...any) (*Run, error) {
	r := &Run{}
	var (
		retrying    bool
		nextTry     *time.Time
		maxAttempts *int
		retryErr    *string
		awaitV      *int
		awaitSince  *time.Time
	)
	err := row.Scan(append([]any{&r.Key, &r.Workflow, &r.Input, &r.Status, &r.Schedule, &r.Slot, &r.Shard, &r.RiverJobID, &r.Attempts, &r.Failures,
		&r.LastError, &r.WakeAt, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt, &r.CancelRequestedAt, &r.Version, &r.HistoryPrunedAt, &r.Steps,
		&r.FailuresInARow, &retrying, &nextTry, &maxAttempts, &retryErr, &awaitV, &awaitSince}, extra...)...)
	if err != nil {
		return nil, err
	}
	r.Awaiting = scanAwaiting(awaitV, awaitSince)
	if retrying {
		r.Retry = &Retry{FailuresInARow: r.FailuresInARow, NextTryAt: nextTry, LastError: deref(retryErr)}
		if maxAttempts != nil {
			r.Retry.MaxFailures = *maxAttempts
		}
	}
	return r, nil
}

// GetRun reads one run, with its derived retry state (Run.Retry, Run.FailuresInARow).
func GetRun(ctx context.Context, q stepwisetype.DBTX, key string) (*Run, error) {
	var ws waitScan
	r, err := scanRun(q.QueryRow(ctx, `SELECT `+runColumnsSQL+waitColumnsSQL+` FROM stepwise_run r`+runJoinsSQL+waitJoinsSQL+` WHERE r.key = $1`, key), ws.dest()...)
	if err == nil {
		r.Parent, r.Wait = ws.parent, ws.state()
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", ErrRunNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("reading run %q: %w", key, err)
	}
	return r, nil
}

// Retrying lists the runs waiting for a retry (Run.Retry set), most failures in a row first,
// at most limit of them, and how many there are in all: what an overview shows as a crash
// loop in the making. It reads the unfinished runs that have failures and the runs of River's
// retryable jobs, through their indexes, never the history of finished runs.
func Retrying(ctx context.Context, q stepwisetype.DBTX, limit int) ([]*Run, int, error) {
	if limit <= 0 {
		return nil, 0, fmt.Errorf("workflow.Retrying: limit is %d; it must be positive", limit)
	}
	rows, err := q.Query(ctx, `SELECT `+runColumnsSQL+`, count(*) OVER ()
		FROM (`+retryCandidatesSQL+`) k
		JOIN stepwise_run r ON r.key = k.key`+runJoinsSQL+`
		WHERE `+retryingSQL+`
		ORDER BY `+failuresInARowSQL+` DESC, r.key
		LIMIT $1`, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("listing retrying runs: %w", err)
	}
	defer rows.Close()
	var (
		out   []*Run
		total int
	)
	for rows.Next() {
		r, err := scanRun(rows, &total)
		if err != nil {
			return nil, 0, fmt.Errorf("listing retrying runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("listing retrying runs: %w", err)
	}
	return out, total, nil
}

// CancelRun asks for a run to stop cooperatively: a run that has not started ends
// 'cancelled' at its next claim; a running one has its step's context cancelled within about
// Config.Heartbeat, its open step rolled back, and ends 'cancelled' with reason recorded; one
// that is not being worked (sleeping, or waiting for River's retry) is ended 'cancelled' by
// the next maintenance pass, within about MaintenanceInterval.
// Committed steps stay committed. Cancelling a finished run does nothing and returns nil.
func CancelRun(ctx context.Context, q stepwisetype.DBTX, key, reason string) error {
	if err := requestCancel(ctx, q, key, reason); err != nil {
		return fmt.Errorf("requesting cancellation of run %q: %w", key, err)
	}
	return nil
}

// ResumeTx continues a failed or cancelled run from its last committed cursor, in the
// caller's transaction, only if the run's Version is still seenVersion: the run the person
// read. It is what stepwise.Client.RunResume/RunResumeTx call, and it returns the keys of the
// descendants it left as they are (below).
//
// The run goes back to pending under a new River job (same queue, priority and max attempts
// as its last job, when River still has it) with a fresh crash-loop budget, and the
// checkpoint is left as committed, so no committed step is redone. The run's failed or
// cancelled descendants (Step.StartChild) are resumed with it, except those that became
// failed or cancelled after the run ended (other than by the run's own cancellation reaching
// them), and every run below them: news the person has not seen, left as they are and
// listed in the run's 'run.resume' event (left_as_they_are) and returned, for the person to resume on
// their own if that is the decision. A run waiting for its children sees a left one as it
// is (failed or cancelled) and goes on: to have it run, resume it on its own first. actor (who) and reason (why, e.g. a ticket) are required and recorded in the run's 'run.resume' event; neither may hold
// control or invisible formatting characters (Unicode Cc, Cf, Zl, Zp). A succeeded run is
// never redone; a pending or running one is refused (it is not stopped): ErrRunNotResumable
// (at the version seen; a run that moved since gets the *RunChangedError below first).
//
// seenVersion must be a Version read from the run (1 or more); there is no unconditional
// resume. A run resumed by someone else meanwhile, run and failed again (perhaps for a reason
// that should not be retried blindly) is refused with a *RunChangedError (errors.Is
// ErrRunChanged) that says what it is now; read it again and decide again. A script that
// decides on what the run is now reads it (GetRun) in tx and passes that Version.
//
// The run's new job and its 'run.resume' event commit or roll back with tx. On any error
// nothing of this call remains in tx (it works under a savepoint), so a caller that commits
// anyway commits no orphan job.
func ResumeTx(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, seenVersion int64, actor, reason string) (left []string, err error) {
	switch {
	case client == nil:
		return nil, errors.New("resuming a run: the River client is nil")
	case seenVersion < 1:
		return nil, fmt.Errorf("resuming run %q: seen version %d: pass the run's Version as read (1 or more)", key, seenVersion)
	case actor == "":
		return nil, fmt.Errorf("resuming run %q: actor is empty; say who resumes the run, for the audit trail", key)
	case reason == "":
		return nil, fmt.Errorf("resuming run %q: reason is empty; say why the run can go on now (e.g. the incident fixed)", key)
	}
	if err := audittext.Check("actor", actor); err != nil {
		return nil, fmt.Errorf("resuming run %q: %w", key, err)
	}
	if err := audittext.Check("reason", reason); err != nil {
		return nil, fmt.Errorf("resuming run %q: %w", key, err)
	}
	// Guards against a refused resume leaving its River job in the caller's transaction: the
	// job is inserted before the guarded transition, and a caller may commit after an error.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("resuming run %q: %w", key, err)
	}
	defer pgtx.Rollback(ctx, sp)
	if left, err = resumeTx(ctx, client, sp, key, seenVersion, actor, reason); err != nil {
		return nil, err
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("resuming run %q: releasing its savepoint: %w", key, err)
	}
	return left, nil
}

// resumeTx resumes the run in tx and returns the descendants it left as they are; a non-nil
// error leaves tx to be rolled back.
func resumeTx(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, seenVersion int64, actor, reason string) ([]string, error) {
	run, err := GetRun(ctx, tx, key)
	if err != nil {
		return nil, fmt.Errorf("resuming run %q: %w", key, err)
	}
	// Guards against a decision on a stale screen: the run the person read may have been
	// resumed, run and failed again since, failed or cancelled as before but for another
	// reason (ABA on the status).
	if run.Version != seenVersion {
		return nil, &RunChangedError{Key: key, SeenVersion: seenVersion, Status: run.Status, Version: run.Version, LastError: run.LastError}
	}
	if run.Status != RunStatusFailed && run.Status != RunStatusCancelled {
		return nil, fmt.Errorf("%w: run %q is %s; only a failed or cancelled run can be resumed", ErrRunNotResumable, key, run.Status)
	}
	// A resume reaches the run's descendants (Step.StartChild) that were failed or cancelled,
	// in the same transaction: a parent resumed into a wait for its children must not wait
	// for children that will never run again. Those that are news to the person are read
	// (and all of them locked) first, so that the run's resume event says which it leaves.
	ended := run.UpdatedAt
	if run.FinishedAt != nil {
		ended = *run.FinishedAt
	}
	kids, err := readDescendants(ctx, tx, key, ended)
	if err != nil {
		return nil, err
	}
	var left []string
	for _, c := range kids {
		if c.left {
			left = append(left, c.key)
		}
	}
	opts := &river.InsertOpts{}
	if run.RiverJobID != nil {
		var queue string
		var priority, maxAttempts int
		err := tx.QueryRow(ctx, `SELECT queue, priority, max_attempts FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&queue, &priority, &maxAttempts)
		switch {
		case err == nil:
			opts.Queue, opts.Priority, opts.MaxAttempts = queue, priority, maxAttempts
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, fmt.Errorf("resuming run %q: reading its last job: %w", key, err)
		}
	}
	if opts.Metadata, err = runstart.WithRunKey(ctx, nil, key); err != nil {
		return nil, err
	}
	ins, err := client.InsertTx(ctx, tx, rawArgs{kind: run.Workflow, raw: run.Input}, opts)
	if err != nil {
		return nil, fmt.Errorf("resuming run %q: inserting its River job: %w", key, err)
	}
	// Guards: two resumes at once, or a run that changed since it was read (its version).
	ok, err := resumeRun(ctx, tx, key, run.Status, run.Version, ins.Job.ID, actor, reason, nil, left)
	if err != nil {
		return nil, fmt.Errorf("resuming run %q: %w", key, err)
	}
	if !ok {
		// Read committed: this statement sees what moved it (the job inserted above is
		// rolled back with the transaction).
		now, err := GetRun(ctx, tx, key)
		if err != nil {
			return nil, fmt.Errorf("resuming run %q: %w", key, errRunMoved)
		}
		return nil, &RunChangedError{Key: key, SeenVersion: run.Version, Status: now.Status, Version: now.Version, LastError: now.LastError}
	}
	return left, resumeDescendants(ctx, client, tx, key, run.Version, kids, actor, reason)
}

// descendant is a failed or cancelled descendant of a run being resumed, as read and locked
// by readDescendants.
type descendant struct {
	key, workflow string
	input         json.RawMessage
	status        RunStatus
	version       int64
	queue         *string
	priority, max *int
	left          bool // news to the person: left as it is
}

// readDescendants reads, and locks until tx ends, the failed or cancelled descendants of the
// run key being resumed at the version that ended at ended, and marks those it leaves as
// they are, parents before their children.
//
// The person decided on the run as it ended, and its version does not move when a descendant
// does. So a failed or cancelled descendant that reached that state after the run ended is
// news the person has not seen: a child retried by a colleague that now fails for another
// reason, one still running when the run failed that failed later, one the run's own step
// cancelled. It is left as it is, with every run below it whatever their status, and the
// run's run.resume event lists it (left_as_they_are): the person resumes it on its own, at
// its version, if that is the decision. The one exception is the cancellation that ended
// the run reaching its descendants: a descendant whose last cancel request or resume is a
// cancel that came with an ancestor's (the cascade of CancelRun) at or before the run ended,
// which ends each descendant at its own pace after the run, is resumed with it. Guards
// against: a parent's resume re-running, unseen, a child a colleague retried and that failed
// again (the ABA of ResumeTx one level down). Leaving it, rather than refusing the parent's
// resume, keeps a parent whose child fails for good resumable: refusing would send the
// person round resuming the child for ever, each failure again after the parent's end.
func readDescendants(ctx context.Context, tx pgx.Tx, key string, ended time.Time) ([]descendant, error) {
	rows, err := tx.Query(ctx, `
		WITH RECURSIVE tree AS (
			SELECT c.key, 1 AS depth, `+newsSQL+` AS left_ FROM stepwise_run c WHERE c.parent_key = $1
			UNION ALL
			SELECT c.key, t.depth + 1, t.left_ OR `+newsSQL+` FROM stepwise_run c JOIN tree t ON c.parent_key = t.key
		)
		SELECT r.key, r.workflow, r.input, r.status, r.version, j.queue, j.priority, j.max_attempts, tree.left_
		  FROM stepwise_run r JOIN tree USING (key) LEFT JOIN river_job j ON j.id = r.river_job_id
		 WHERE r.status IN ('failed', 'cancelled')
		 ORDER BY tree.depth, r.key
		   FOR UPDATE OF r`, key, ended)
	if err != nil {
		return nil, fmt.Errorf("resuming the children of run %q: %w", key, err)
	}
	kids, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (descendant, error) {
		var c descendant
		return c, row.Scan(&c.key, &c.workflow, &c.input, &c.status, &c.version, &c.queue, &c.priority, &c.max, &c.left)
	})
	if err != nil {
		return nil, fmt.Errorf("resuming the children of run %q: %w", key, err)
	}
	return kids, nil
}

// newsSQL is true for a run c that is failed or cancelled since after $2, the end of the run
// being resumed, other than by that run's own cancellation reaching it (readDescendants).
const newsSQL = `(c.status IN ('failed', 'cancelled') AND coalesce(c.finished_at > $2, false)
	AND NOT (c.status = 'cancelled' AND coalesce((
		-- Its last cancel request or resume: a cancel that came with an ancestor's, at or
		-- before the run ended, is the run's own cancellation reaching it.
		SELECT e.kind = 'run.cancel_requested' AND e.detail ? 'with_parent' AND e.at <= $2
		  FROM stepwise_event e
		 WHERE e.subject = c.key AND e.kind IN ('run.cancel_requested', 'run.resume')
		 ORDER BY e.id DESC LIMIT 1), false)))`

// resumeDescendants resumes, in tx, the descendants read by readDescendants that are not
// left as they are, each under a new job (its last job's queue, priority and max attempts),
// compare-and-set on the version read, recording the run key and the version seen of it.
func resumeDescendants(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, seenVersion int64, kids []descendant, actor, reason string) error {
	for _, c := range kids {
		if c.left {
			continue
		}
		opts := &river.InsertOpts{}
		if c.queue != nil {
			opts.Queue, opts.Priority, opts.MaxAttempts = *c.queue, *c.priority, *c.max
		}
		md, err := runstart.WithRunKey(ctx, nil, c.key)
		if err != nil {
			return err
		}
		opts.Metadata = md
		ins, err := client.InsertTx(ctx, tx, rawArgs{kind: c.workflow, raw: c.input}, opts)
		if err != nil {
			return fmt.Errorf("resuming run %q with its parent %q: inserting its River job: %w", c.key, key, err)
		}
		ok, err := resumeRun(ctx, tx, c.key, c.status, c.version, ins.Job.ID, actor, "with its parent run "+key+": "+reason, &withParent{key: key, seenVersion: seenVersion}, nil)
		if err != nil {
			return fmt.Errorf("resuming run %q with its parent %q: %w", c.key, key, err)
		}
		if !ok {
			// Its row is locked since the read: it cannot have moved. Refuse rather than
			// resume a tree other than the one read (the caller rolls tx back).
			return fmt.Errorf("resuming run %q with its parent %q: %w", c.key, key, errRunMoved)
		}
	}
	return nil
}
