// Package runwait wakes runs that wait (package workflow's WaitFor... outcomes) from the
// transactions that satisfy them: an operation's last outcome (package outbox, for every
// mover: dispatcher, reconciler, console), a child run's finish, a signal. It is internal so
// that package outbox can wake runs without importing package workflow.
//
// The protocol (docs/design.md, "Waits"). The waiter and every satisfier of a run take the
// run's wait lock (LockSQL: a transaction-scoped advisory lock on the run's key) before they
// look at the other side's writes, each look in a statement of its own (READ COMMITTED: a
// statement sees what committed before it began):
//
//   - the waiting step takes the lock, then checks the condition, then (if it does not hold)
//     records the wait and commits;
//   - a satisfier writes (an operation at rest, a child finished, a signal stored), takes the
//     lock, then looks for the run's open wait and checks its condition.
//
// Whoever locks second sees the other's commit: the waiter sees the satisfying write and does
// not sleep, or the satisfier sees the wait and wakes the run. Guards against the lost wake
// of two transactions that each miss the other's uncommitted write — between the waiter and
// a satisfier, and between two satisfiers that each bring the last-but-one piece (two
// children finishing at once each saw the other still running: measured, a parent left
// asleep). The lock is not the run's row: a run's steps, its slice releases and its
// heartbeats never wait for it, only waiters and satisfiers of the same run.
package runwait

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/tracing"
)

// MetadataRunKey is the River job metadata field naming the run a job delivers; it must equal
// package workflow's (workflow checks it at init).
const MetadataRunKey = "stepwise_run"

// MetadataTraceParent is the job metadata field of the traceparent of what queued the job.
const MetadataTraceParent = "stepwise_traceparent"

var (
	clientOnce sync.Once
	client     *river.Client[pgx.Tx]
	clientErr  error
)

// Client is an insert-only River client (no pool, no queues): InsertTx and JobCancelTx in the
// caller's transaction, with River's own insert notification, so that a wake needs no River
// client from the caller (workflow.Signal, the reconciler, the console have none).
//
// Its FetchCooldown is River's minimum because River's insert notifications are rate limited
// per queue per client by it: with the default 100 ms, a wake that followed another within
// 100 ms sent no notification and its run waited for a worker's next poll (a second by
// default). Measured by the lab bench's waits section, 20 wakes back to back: p99 1.06 s
// before. Waking is this client's only job, and each wake must be prompt.
func Client() (*river.Client[pgx.Tx], error) {
	clientOnce.Do(func() {
		client, clientErr = river.NewClient(riverpgxv5.New(nil), &river.Config{FetchCooldown: river.FetchCooldownMin})
		if clientErr != nil {
			clientErr = fmt.Errorf("runwait: building the insert-only River client: %w", clientErr)
		}
	})
	return client, clientErr
}

// RawArgs re-inserts a run's original args, byte for byte, under a new job.
type RawArgs struct {
	KindName string
	Raw      json.RawMessage
}

// Kind is the run's workflow kind.
func (r RawArgs) Kind() string { return r.KindName }

// MarshalJSON returns the run's input as stored.
func (r RawArgs) MarshalJSON() ([]byte, error) { return r.Raw, nil }

// Metadata is the job metadata naming the run (and the traceparent of ctx's span, if any).
func Metadata(ctx context.Context, key string) ([]byte, error) {
	m := map[string]any{MetadataRunKey: key}
	if tp := tracing.TraceParent(ctx); tp != "" {
		m[MetadataTraceParent] = tp
	}
	return json.Marshal(m)
}

// ConditionSQL is whether the wait w holds, over a row w with the columns of stepwise_wait
// (run_key, kind, manual_at_rest, children, signal_name). Each branch is an index probe:
// stepwise_operation_run_key_idx, stepwise_run_parent_idx, stepwise_signal_pending_idx.
const ConditionSQL = `(CASE w.kind
	WHEN 'operations' THEN NOT EXISTS (
		SELECT 1 FROM stepwise_operation o
		 WHERE o.run_key = w.run_key AND o.state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT')
		   AND (NOT w.manual_at_rest OR o.state <> 'MANUAL'))
	WHEN 'children' THEN NOT EXISTS (
		SELECT 1 FROM stepwise_run ch
		 WHERE ch.parent_key = w.run_key AND ch.status IN ('pending', 'running')
		   AND (w.children IS NULL OR ch.key = ANY (w.children)))
	WHEN 'signal' THEN EXISTS (
		SELECT 1 FROM stepwise_signal sg
		 WHERE sg.run_key = w.run_key AND sg.name = w.signal_name AND sg.consumed_at IS NULL)
	ELSE false END)`

// dueSQL selects the open waits among the runs $1 whose condition holds and whose run sleeps
// on its timeout job (still scheduled), locking that job: River can neither fetch nor
// schedule it until this transaction ends. A job no longer scheduled means the run is awake
// already (its timeout fired, or it was woken); its next step sees the condition itself.
const dueSQL = `
	SELECT w.run_key, r.workflow, r.input, j.id, j.queue, j.priority, j.max_attempts
	  FROM stepwise_wait w
	  JOIN stepwise_run r ON r.key = w.run_key AND r.status IN ('pending', 'running')
	  JOIN river_job j ON j.id = r.river_job_id AND j.state = 'scheduled'
	 WHERE w.run_key = ANY ($1) AND w.woken_at IS NULL AND ` + ConditionSQL + `
	 ORDER BY w.run_key
	   FOR UPDATE OF j`

// waitLockClass is the first key of the runs' wait locks (advisory, two-int form, so that it
// cannot meet the single bigint key of migrations' lock): "STWP".
const waitLockClass = 0x53545750

func init() {
	if fmt.Sprint(waitLockClass) != waitLockClassSQL {
		panic("runwait: waitLockClassSQL differs from waitLockClass")
	}
}

// LockSQL takes the wait locks of the runs $1 (text[], sorted: two satisfiers lock in the
// same order), until the transaction ends.
const LockSQL = `SELECT count(pg_advisory_xact_lock(` + waitLockClassSQL + `, hashtext(k))) FROM (SELECT k FROM unnest($1::text[]) k ORDER BY k) s`

const waitLockClassSQL = "1398036304" // waitLockClass in decimal

type due struct {
	key         string
	workflow    string
	input       json.RawMessage
	jobID       int64
	queue       string
	priority    int
	maxAttempts int
}

// AfterWrite wakes, in tx, those of the runs keys that wait and whose condition holds now:
// call it after the write that may satisfy them (in the same transaction), with by naming
// the cause for the audit trail. It reports the runs it woke. Two statements in one round
// trip when no run waits.
func AfterWrite(ctx context.Context, tx pgx.Tx, keys []string, by string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	keys = slices.Compact(slices.Sorted(slices.Values(keys)))
	b := &pgx.Batch{}
	b.Queue(LockSQL, keys)
	b.Queue(dueSQL, keys)
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("locking runs %v to wake their waits: %w", keys, err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("finding the waits of runs %v: %w", keys, err)
	}
	ds, err := collectDue(rows)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("finding the waits of runs %v: %w", keys, err)
	}
	return wakeAll(ctx, tx, ds, by)
}

func collectDue(rows pgx.Rows) ([]due, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (due, error) {
		var d due
		err := row.Scan(&d.key, &d.workflow, &d.input, &d.jobID, &d.queue, &d.priority, &d.maxAttempts)
		return d, err
	})
}

func wakeAll(ctx context.Context, tx pgx.Tx, ds []due, by string) ([]string, error) {
	var woke []string
	for _, d := range ds {
		ok, err := wake(ctx, tx, d, by)
		if err != nil {
			return woke, err
		}
		if ok {
			woke = append(woke, d.key)
		}
	}
	return woke, nil
}

// wake makes the run d due now: its timeout job (locked by the caller's query, still
// scheduled) is cancelled and a job available now takes over delivery, compare-and-set on the
// run's job, with the wait marked woken and a run.wake event, all in tx. River's insert
// notifies the queue's producers at commit, so the run is fetched at once.
func wake(ctx context.Context, tx pgx.Tx, d due, by string) (bool, error) {
	c, err := Client()
	if err != nil {
		return false, err
	}
	if _, err := c.JobCancelTx(ctx, tx, d.jobID); err != nil && !errors.Is(err, river.ErrNotFound) {
		return false, fmt.Errorf("waking run %q: cancelling its timeout job %d: %w", d.key, d.jobID, err)
	}
	md, err := Metadata(ctx, d.key)
	if err != nil {
		return false, err
	}
	ins, err := c.InsertTx(ctx, tx, RawArgs{KindName: d.workflow, Raw: d.input},
		&river.InsertOpts{Queue: d.queue, Priority: d.priority, MaxAttempts: d.maxAttempts, Metadata: md})
	if err != nil {
		return false, fmt.Errorf("waking run %q: inserting its job: %w", d.key, err)
	}
	// Guards: a takeover, resume or finish that moved the run off its timeout job meanwhile
	// (the compare-and-set on river_job_id); then nothing changes and the caller's
	// transaction must not keep the job it inserted: it is cancelled again at once.
	var n int
	err = tx.QueryRow(ctx, `
		WITH r AS (
			UPDATE stepwise_run SET river_job_id = $3, wake_at = NULL, updated_at = now()
			 WHERE key = $1 AND river_job_id = $2 AND status IN ('pending', 'running') RETURNING key
		), w AS (
			UPDATE stepwise_wait SET woken_at = clock_timestamp(), woken_by = $4 WHERE run_key IN (SELECT key FROM r) RETURNING run_key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, actor, detail)
			SELECT key, 'run.wake', $4, jsonb_build_object('old_job', $2::bigint, 'new_job', $3::bigint) FROM r
		)
		SELECT count(*) FROM r`, d.key, d.jobID, ins.Job.ID, by).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("waking run %q: %w", d.key, err)
	}
	if n == 0 {
		if _, err := c.JobCancelTx(ctx, tx, ins.Job.ID); err != nil {
			return false, fmt.Errorf("waking run %q: withdrawing its job: %w", d.key, err)
		}
		return false, nil
	}
	return true, nil
}

// AfterChildFinished wakes, in tx, the parent of the run child if it waits for its children
// and they are finished now. Call it in the transaction that finished child. One statement
// for a run without a parent.
func AfterChildFinished(ctx context.Context, tx pgx.Tx, child string) error {
	var parent *string
	err := tx.QueryRow(ctx, `SELECT parent_key FROM stepwise_run WHERE key = $1`, child).Scan(&parent)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && parent == nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the parent of run %q: %w", child, err)
	}
	_, err = AfterWrite(ctx, tx, []string{*parent}, "child:"+child)
	return err
}

// Backstop is maintenance's side: it wakes waits whose wake was lost, in two bounded,
// indexed queries.
//
//   - woken waits (stepwise_wait_woken_idx: only the waits woken and not yet taken up) whose
//     run's job is nevertheless scheduled more than graceMs from now: the wake's job was
//     lost (an operator rescheduled or removed it). Within one pass;
//   - a page of open waits by run key after `after`, whose condition holds though nobody
//     woke them (a satisfier that does not know waits: an older binary in a rolling deploy,
//     a hand-written UPDATE of an operation). Within (waits / page) passes.
//
// It returns the runs woken and the key to continue the page from ("" to start again).
func Backstop(ctx context.Context, tx pgx.Tx, after string, page int, graceMs int64) (woken []string, next string, err error) {
	rows, err := tx.Query(ctx, `
		SELECT w.run_key, r.workflow, r.input, j.id, j.queue, j.priority, j.max_attempts
		  FROM stepwise_wait w
		  JOIN stepwise_run r ON r.key = w.run_key AND r.status IN ('pending', 'running')
		  JOIN river_job j ON j.id = r.river_job_id AND j.state = 'scheduled'
		 WHERE w.woken_at IS NOT NULL AND w.woken_at < now() - $1 * interval '1 millisecond'
		   AND j.scheduled_at > now() + $1 * interval '1 millisecond'
		 ORDER BY w.run_key
		 LIMIT 100
		   FOR UPDATE OF j SKIP LOCKED`, graceMs)
	if err != nil {
		return nil, after, fmt.Errorf("finding woken waits left asleep: %w", err)
	}
	lost, err := collectDue(rows)
	if err != nil {
		return nil, after, fmt.Errorf("finding woken waits left asleep: %w", err)
	}
	if woken, err = wakeAll(ctx, tx, lost, "maintenance"); err != nil {
		return woken, after, err
	}
	var last *string
	var n int
	if err := tx.QueryRow(ctx, `SELECT max(run_key), count(*)::int FROM (
			SELECT run_key FROM stepwise_wait WHERE woken_at IS NULL AND run_key > $1 ORDER BY run_key LIMIT $2) p`,
		after, page).Scan(&last, &n); err != nil {
		return woken, after, fmt.Errorf("paging open waits: %w", err)
	}
	if n == 0 {
		return woken, "", nil
	}
	rows, err = tx.Query(ctx, `
		SELECT w.run_key, r.workflow, r.input, j.id, j.queue, j.priority, j.max_attempts
		  FROM stepwise_wait w
		  JOIN stepwise_run r ON r.key = w.run_key AND r.status IN ('pending', 'running')
		  JOIN river_job j ON j.id = r.river_job_id AND j.state = 'scheduled'
		 WHERE w.run_key > $1 AND w.run_key <= $2 AND w.woken_at IS NULL AND `+ConditionSQL+`
		 ORDER BY w.run_key
		   FOR UPDATE OF j SKIP LOCKED`, after, *last)
	if err != nil {
		return woken, after, fmt.Errorf("checking a page of open waits: %w", err)
	}
	satisfied, err := collectDue(rows)
	if err != nil {
		return woken, after, fmt.Errorf("checking a page of open waits: %w", err)
	}
	more, err := wakeAll(ctx, tx, satisfied, "maintenance")
	woken = append(woken, more...)
	if err != nil {
		return woken, after, err
	}
	next = ""
	if n == page {
		next = *last
	}
	return woken, next, nil
}
