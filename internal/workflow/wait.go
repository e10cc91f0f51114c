package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/runstart"
	"github.com/stepwise-go/stepwise/internal/runwait"
)

// Waits (docs/design.md, "Waits"). A step returns WaitForOperations, WaitForChildren or
// WaitForSignal; its commit records the wait and a River job scheduled at the wait's
// deadline, and completes the attempt's job: the run holds no worker and no lease while it
// waits. The commit that satisfies the wait makes the run due in the same transaction
// (package runwait); maintenance is only the backstop. The step after the wait re-checks the
// condition in its own transaction before the user's step runs, and learns the outcome from
// Step.Woken.

// WaitKind is what a run waits for.
type WaitKind string

// Wait kinds.
const (
	WaitOperations WaitKind = "operations"
	WaitChildren   WaitKind = "children"
	WaitSignal     WaitKind = "signal"
)

// waitSpec is a wait a step asked for.
type waitSpec struct {
	kind         WaitKind
	manualAtRest bool
	children     []string // nil: every child
	signal       string
	timeout      time.Duration
	// deadline, when set, is the deadline already committed (a wait re-entered after a wake
	// that found its condition not holding keeps its deadline and since).
	deadline time.Time
	since    *time.Time
}

// WaitForOperations commits the step and waits, holding no worker, until every operation this
// run enqueued (outbox operations whose RunKey is the run's) is at rest: SUCCEEDED or
// FAILED_PERMANENT. An operation in MANUAL is not at rest until a person resolves it. After
// timeout the run goes on anyway; Step.Woken says which.
func WaitForOperations(timeout time.Duration) Next {
	return Next{kind: nextWait, wait: &waitSpec{kind: WaitOperations, timeout: timeout}}
}

// WaitForOperationsOrManual is WaitForOperations where an operation in MANUAL counts as at
// rest: the run goes on, and the step after the wait decides what a MANUAL operation means.
func WaitForOperationsOrManual(timeout time.Duration) Next {
	return Next{kind: nextWait, wait: &waitSpec{kind: WaitOperations, manualAtRest: true, timeout: timeout}}
}

// WaitForChildren commits the step and waits, holding no worker, until the child runs keys
// (started by this run with Step.StartChild) have finished: succeeded, failed or cancelled.
// No keys: every child of the run. A key that is not a child of the run fails the step.
func WaitForChildren(timeout time.Duration, keys ...string) Next {
	var children []string
	if len(keys) > 0 {
		children = append([]string{}, keys...)
	}
	return Next{kind: nextWait, wait: &waitSpec{kind: WaitChildren, children: children, timeout: timeout}}
}

// WaitForSignal commits the step and waits, holding no worker, for a signal called name sent
// to this run (Signal). A signal sent before the run waits is kept and satisfies the wait at
// once; each signal is taken by one wait.
func WaitForSignal(name string, timeout time.Duration) Next {
	return Next{kind: nextWait, wait: &waitSpec{kind: WaitSignal, signal: name, timeout: timeout}}
}

// Woken is what the wait before a step ended with.
type Woken struct {
	Kind WaitKind
	// TimedOut is true when the deadline passed before the condition held; the fields below
	// say what was there at that point.
	TimedOut bool
	// Since is when the run began to wait; Deadline when it would time out.
	Since, Deadline time.Time
	// Operations counts the run's operations by state (outbox.State names), for WaitOperations.
	Operations map[string]int
	// Children is the status of each child waited for, for WaitChildren.
	Children map[string]RunStatus
	// Signal is the signal taken, for WaitSignal (nil when it timed out).
	Signal *ReceivedSignal
}

// ReceivedSignal is a signal a wait took.
type ReceivedSignal struct {
	Name    string
	ID      string
	Payload json.RawMessage
	SentAt  time.Time
}

// Woken returns what the wait before this step ended with, or nil when the step does not
// follow a wait.
func (s *Step[A, C]) Woken() *Woken { return s.woken }

// StartChild starts a child run in the step's transaction, so that it exists exactly when the
// step commits, with this run recorded as its parent: WaitForChildren waits for it, and
// CancelRun and a resume (ResumeTx) of this run reach it. As StartTx: the same key with the same
// workflow, input and parent returns the existing run.
func (s *Step[A, C]) StartChild(ctx context.Context, key string, args river.JobArgs, opts *StartOpts) (*Run, error) {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return nil, fmt.Errorf("Step.StartChild(%q): no River client in the step's context (%w); call it with the ctx Step was given", key, err)
	}
	if key == s.RunKey {
		return nil, fmt.Errorf("Step.StartChild(%q): a run cannot be its own child", key)
	}
	var insertOpts *river.InsertOpts
	if opts != nil {
		insertOpts = opts.InsertOpts
	}
	tx := s.raw
	if tx == nil {
		tx = s.Tx
	}
	parent := s.RunKey
	return startTxParent(ctx, client, tx, key, args, insertOpts, &parent)
}

// StartRun starts a run of its own (not a child: no parent, so neither this run's waits,
// cancel nor resume reach it) in the step's transaction, so that it exists exactly when the
// step commits and never when the step rolls back: a step that closes a day starts the day's
// reconciliation this way. As stepwise.Client.RunStart: the same key with the same workflow
// and input returns the existing run.
func (s *Step[A, C]) StartRun(ctx context.Context, key string, args river.JobArgs, opts *StartOpts) (*Run, error) {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return nil, fmt.Errorf("Step.StartRun(%q): no River client in the step's context (%w); call it with the ctx Step was given", key, err)
	}
	tx := s.raw
	if tx == nil {
		tx = s.Tx
	}
	return StartTx(ctx, client, tx, key, args, opts)
}

// WaitState is what a run waits for, read with the run (Run.Wait).
type WaitState struct {
	Kind WaitKind
	// Since is when the wait began; Deadline when it times out.
	Since, Deadline time.Time
	// WokenAt is set once the run was made due (its condition held); it waits for a worker.
	WokenAt *time.Time
	WokenBy string
	// ManualAtRest: MANUAL operations count as at rest (WaitForOperationsOrManual).
	ManualAtRest bool
	// Children are the child runs waited for (nil: every child); Signal the signal's name.
	Children []string
	Signal   string
	// For operations: the run's operations, those not at rest, and those in MANUAL.
	Operations, NotAtRest, Manual int
	// For children: the children waited for, and those not finished.
	ChildRuns, Unfinished int
	// Missing says in words what the run still waits for.
	Missing string
}

// waitColumnsSQL are GetRun's wait columns (scanned by scanWait), over the joins of waitJoinsSQL.
const waitColumnsSQL = `, r.parent_key, w.kind, w.since, w.deadline, w.woken_at, w.woken_by, w.manual_at_rest, w.children, w.signal_name,
	coalesce(wo.total, 0), coalesce(wo.not_at_rest, 0), coalesce(wo.manual, 0), coalesce(wc.total, 0), coalesce(wc.unfinished, 0)`

// waitJoinsSQL joins a run's open wait and, only for its kind, the counts of what it waits
// for (each an index range of the one run).
const waitJoinsSQL = `
	LEFT JOIN stepwise_wait w ON w.run_key = r.key AND r.status IN ('pending', 'running')
	LEFT JOIN LATERAL (
		SELECT count(*) AS total,
		       count(*) FILTER (WHERE o.state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT') AND NOT (w.manual_at_rest AND o.state = 'MANUAL')) AS not_at_rest,
		       count(*) FILTER (WHERE o.state = 'MANUAL') AS manual
		  FROM stepwise_operation o WHERE w.kind = 'operations' AND o.run_key = w.run_key) wo ON true
	LEFT JOIN LATERAL (
		SELECT count(*) AS total, count(*) FILTER (WHERE ch.status IN ('pending', 'running')) AS unfinished
		  FROM stepwise_run ch
		 WHERE w.kind = 'children' AND ch.parent_key = w.run_key AND (w.children IS NULL OR ch.key = ANY (w.children))) wc ON true`

type waitScan struct {
	parent                              *string
	kind                                *string
	since, deadline, wokenAt            *time.Time
	wokenBy                             *string
	manual                              *bool
	children                            []string
	signal                              *string
	ops, notAtRest, manualN, total, unf int
}

func (w *waitScan) dest() []any {
	return []any{&w.parent, &w.kind, &w.since, &w.deadline, &w.wokenAt, &w.wokenBy, &w.manual, &w.children, &w.signal,
		&w.ops, &w.notAtRest, &w.manualN, &w.total, &w.unf}
}

func (w *waitScan) state() *WaitState {
	if w.kind == nil {
		return nil
	}
	ws := &WaitState{Kind: WaitKind(*w.kind), Since: *w.since, Deadline: *w.deadline, WokenAt: w.wokenAt, WokenBy: deref(w.wokenBy),
		ManualAtRest: w.manual != nil && *w.manual, Children: w.children, Signal: deref(w.signal),
		Operations: w.ops, NotAtRest: w.notAtRest, Manual: w.manualN, ChildRuns: w.total, Unfinished: w.unf}
	switch ws.Kind {
	case WaitOperations:
		ws.Missing = fmt.Sprintf("%s of %s operations not at rest", thousands(ws.NotAtRest), thousands(ws.Operations))
		if ws.Manual > 0 {
			if ws.ManualAtRest {
				ws.Missing += fmt.Sprintf("; %s MANUAL (counted at rest)", thousands(ws.Manual))
			} else {
				ws.Missing += fmt.Sprintf("; %s MANUAL", thousands(ws.Manual))
			}
		}
	case WaitChildren:
		ws.Missing = fmt.Sprintf("%s of %s child runs unfinished", thousands(ws.Unfinished), thousands(ws.ChildRuns))
	case WaitSignal:
		ws.Missing = fmt.Sprintf("signal %q not received", ws.Signal)
	}
	if ws.WokenAt != nil {
		ws.Missing = "nothing: woken (" + ws.WokenBy + "), waiting for a worker"
	}
	return ws
}

// thousands formats n with commas: 2,450.
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Signal sends the signal name to the run runKey in tx: stored durably, then, in the same
// transaction, the run is made due if it waits for it (WaitForSignal). A signal sent before
// the run waits (or before it exists) is kept for its wait; sent again with the same id it
// is one signal (the first payload stays). payload is encoded as JSON (nil: JSON null).
func Signal(ctx context.Context, tx pgx.Tx, runKey, name, id string, payload any) error {
	if err := checkpoint.ValidateKey(runKey); err != nil {
		return fmt.Errorf("workflow.Signal: run %w", err)
	}
	if name == "" || len(name) > 200 {
		return fmt.Errorf("workflow.Signal(%q): name %q must be 1 to 200 bytes", runKey, name)
	}
	if id == "" || len(id) > 255 {
		return fmt.Errorf("workflow.Signal(%q, %q): id must be 1 to 255 bytes; use the sender's idempotency key, so a retried send counts once", runKey, name)
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("workflow.Signal(%q, %q): encoding payload: %w", runKey, name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO stepwise_signal (run_key, name, signal_id, payload) VALUES ($1, $2, $3, $4)
		ON CONFLICT (run_key, name, signal_id) DO NOTHING`, runKey, name, id, raw); err != nil {
		return fmt.Errorf("workflow.Signal(%q, %q): storing: %w", runKey, name, err)
	}
	// The satisfier's side of the wait protocol (runwait): after the write, in this tx.
	if _, err := runwait.AfterWrite(ctx, tx, []string{runKey}, "signal:"+name); err != nil {
		return fmt.Errorf("workflow.Signal(%q, %q): %w", runKey, name, err)
	}
	return nil
}

// SignalPool is Signal in a transaction of its own on pool.
func SignalPool(ctx context.Context, pool *pgxpool.Pool, runKey, name, id string, payload any) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Signal(ctx, tx, runKey, name, id, payload) })
}

// checkWait is the waiter's side of the protocol (runwait): the run's wait lock taken, then, in a statement of its own, whether the condition holds already. Guards: a satisfier
// that committed after this step began and did not see the wait (then this sees its write),
// and WaitForChildren naming runs that are not children (their finish would wake no one).
func (a *attempt[A, C]) checkWait(ctx context.Context, tx pgx.Tx, w *waitSpec) (bool, error) {
	b := &pgx.Batch{}
	b.Queue(runwait.LockSQL, []string{a.key})
	b.Queue(`SELECT `+runwait.ConditionSQL+`,
		(SELECT array_agg(k ORDER BY k) FROM unnest(w.children) k
		  WHERE NOT EXISTS (SELECT 1 FROM stepwise_run c WHERE c.key = k AND c.parent_key = w.run_key))
		FROM (SELECT $1::text AS run_key, $2::text AS kind, $3::boolean AS manual_at_rest, $4::text[] AS children, $5::text AS signal_name) w`,
		a.key, string(w.kind), w.manualAtRest, w.children, w.signal)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return false, fmt.Errorf("run %q: locking the run to wait: %w", a.key, err)
	}
	var held bool
	var strangers []string
	if err := br.QueryRow().Scan(&held, &strangers); err != nil {
		return false, fmt.Errorf("run %q: checking its wait: %w", a.key, err)
	}
	if len(strangers) > 0 {
		return false, fmt.Errorf("run %q: WaitForChildren: %v are not children of this run; start them with Step.StartChild", a.key, strangers)
	}
	return held, nil
}

// enterWait records the wait in the step's transaction: a River job scheduled at the
// deadline takes over delivery (compare-and-set on the attempt's job), the wait row, and
// the attempt's own job completed, as Done completes it. Guards: a run taken over or
// finished meanwhile (errRunMoved rolls the step back).
func (a *attempt[A, C]) enterWait(ctx context.Context, tx pgx.Tx, w *waitSpec, deadline time.Time, wokenBy string) error {
	c, err := runwait.Client()
	if err != nil {
		return err
	}
	md, err := runstart.WithRunKey(ctx, nil, a.key)
	if err != nil {
		return err
	}
	var timeoutJob *int64
	if wokenBy == "" {
		// The timeout: a job River makes available at the deadline, like a Sleep's snooze,
		// but inserted in this transaction, so a satisfier finds it scheduled from the commit
		// on (a snooze is recorded by River after the attempt returns: a wake in between
		// would be lost).
		ins, err := c.InsertTx(ctx, tx, rawArgs{kind: a.job.Kind, raw: a.job.EncodedArgs}, &river.InsertOpts{
			Queue: a.job.Queue, Priority: a.job.Priority, MaxAttempts: a.job.MaxAttempts, ScheduledAt: deadline, Metadata: md})
		if err != nil {
			return fmt.Errorf("run %q: scheduling its wait's timeout: %w", a.key, err)
		}
		timeoutJob = &ins.Job.ID
	}
	var n int
	err = tx.QueryRow(ctx, `
		WITH r AS (
			UPDATE stepwise_run SET river_job_id = coalesce($3, river_job_id),
			       released_at = CASE WHEN $3::bigint IS NULL THEN released_at ELSE clock_timestamp() END,
			       wake_at = CASE WHEN $3::bigint IS NULL THEN wake_at ELSE $4 END, updated_at = now()
			 WHERE key = $1 AND status = 'running' AND river_job_id = $2 RETURNING key
		), w AS (
			INSERT INTO stepwise_wait (run_key, kind, manual_at_rest, children, signal_name, since, deadline, woken_at, woken_by)
			SELECT key, $5, $6, $7, $8, coalesce($9, clock_timestamp()), $4,
			       CASE WHEN $10 <> '' THEN clock_timestamp() END, nullif($10, '') FROM r
			ON CONFLICT (run_key) DO UPDATE SET kind = excluded.kind, manual_at_rest = excluded.manual_at_rest,
			       children = excluded.children, signal_name = excluded.signal_name, since = excluded.since,
			       deadline = excluded.deadline, woken_at = excluded.woken_at, woken_by = excluded.woken_by
			RETURNING run_key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, actor, token, attempt, detail)
			SELECT key, 'run.wait', $11, $12, $13, jsonb_strip_nulls(jsonb_build_object('wait', $5::text, 'deadline', $4::timestamptz,
			       'signal', nullif($8, ''), 'children', $7::text[], 'manual_at_rest', $6::boolean, 'timeout_job', $3::bigint,
			       'held_at_once', CASE WHEN $10 <> '' THEN true END)) FROM r
		)
		SELECT count(*) FROM r`, a.key, a.job.ID, timeoutJob, deadline, string(w.kind), w.manualAtRest, w.children, w.signal,
		w.since, wokenBy, a.lease.Owner, a.lease.Token, a.job.Attempt).Scan(&n)
	if err != nil {
		return fmt.Errorf("run %q: recording its wait: %w", a.key, err)
	}
	if n == 0 {
		return fmt.Errorf("run %q: recording its wait: %w", a.key, errRunMoved)
	}
	if timeoutJob == nil {
		return nil
	}
	done, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, a.job)
	if err != nil {
		return fmt.Errorf("completing River job %d of waiting run %q: %w", a.job.ID, a.key, err)
	}
	if done.State != rivertype.JobStateCompleted {
		return fmt.Errorf("completing River job %d of waiting run %q: job is %s, not running; refusing to commit", a.job.ID, a.key, done.State)
	}
	return nil
}

// resolveWait is the step after a wait, in its transaction, before the user's step: it reads
// the run's open wait (locked) and checks the condition itself. Held, or past the deadline:
// the wait is taken (deleted; a signal consumed) with this step's commit and the user's step
// learns the outcome. Neither (a wake that came too early: the condition changed back, e.g. a
// MANUAL operation sent back to retry): rewait is the same wait to re-enter, and the user's
// step does not run. Guards: a run woken before its condition holds.
func (a *attempt[A, C]) resolveWait(ctx context.Context, tx pgx.Tx) (woken *Woken, rewait *waitSpec, err error) {
	var (
		kind, signal    string
		manual, overdue bool
		children        []string
		since, deadline time.Time
	)
	err = tx.QueryRow(ctx, `SELECT kind, manual_at_rest, children, coalesce(signal_name, ''), since, deadline, clock_timestamp() >= deadline
		FROM stepwise_wait WHERE run_key = $1 FOR UPDATE`, a.key).Scan(&kind, &manual, &children, &signal, &since, &deadline, &overdue)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil // taken by an earlier attempt that committed
	}
	if err != nil {
		return nil, nil, fmt.Errorf("run %q: reading its wait: %w", a.key, err)
	}
	wk := &Woken{Kind: WaitKind(kind), Since: since, Deadline: deadline}
	held := false
	switch wk.Kind {
	case WaitOperations:
		rows, err := tx.Query(ctx, `SELECT state, count(*)::int FROM stepwise_operation WHERE run_key = $1 GROUP BY state`, a.key)
		if err != nil {
			return nil, nil, fmt.Errorf("run %q: counting its operations: %w", a.key, err)
		}
		wk.Operations = map[string]int{}
		held = true
		for rows.Next() {
			var st string
			var n int
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return nil, nil, err
			}
			wk.Operations[st] = n
			if st != "SUCCEEDED" && st != "FAILED_PERMANENT" && !(manual && st == "MANUAL") {
				held = false
			}
		}
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("run %q: counting its operations: %w", a.key, err)
		}
	case WaitChildren:
		rows, err := tx.Query(ctx, `SELECT key, status FROM stepwise_run WHERE parent_key = $1 AND ($2::text[] IS NULL OR key = ANY ($2))`, a.key, children)
		if err != nil {
			return nil, nil, fmt.Errorf("run %q: reading its children: %w", a.key, err)
		}
		wk.Children = map[string]RunStatus{}
		held = true
		for rows.Next() {
			var k string
			var st RunStatus
			if err := rows.Scan(&k, &st); err != nil {
				rows.Close()
				return nil, nil, err
			}
			wk.Children[k] = st
			held = held && st.Finished()
		}
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("run %q: reading its children: %w", a.key, err)
		}
	case WaitSignal:
		sg := &ReceivedSignal{Name: signal}
		err := tx.QueryRow(ctx, `SELECT signal_id, payload, sent_at FROM stepwise_signal
			WHERE run_key = $1 AND name = $2 AND consumed_at IS NULL ORDER BY sent_at, signal_id LIMIT 1 FOR UPDATE`,
			a.key, signal).Scan(&sg.ID, &sg.Payload, &sg.SentAt)
		switch {
		case err == nil:
			held = true
			// Taken with this step's commit: a retried step takes it again, and it is
			// taken by one wait only.
			if _, err := tx.Exec(ctx, `UPDATE stepwise_signal SET consumed_at = now() WHERE run_key = $1 AND name = $2 AND signal_id = $3`,
				a.key, signal, sg.ID); err != nil {
				return nil, nil, fmt.Errorf("run %q: taking signal %q: %w", a.key, signal, err)
			}
			wk.Signal = sg
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, nil, fmt.Errorf("run %q: reading signal %q: %w", a.key, signal, err)
		}
	}
	if !held && !overdue {
		return nil, &waitSpec{kind: wk.Kind, manualAtRest: manual, children: children, signal: signal, deadline: deadline, since: &since}, nil
	}
	wk.TimedOut = !held
	_, err = tx.Exec(ctx, `
		WITH w AS (DELETE FROM stepwise_wait WHERE run_key = $1 RETURNING run_key)
		INSERT INTO stepwise_event (subject, kind, actor, token, attempt, detail)
		SELECT run_key, 'run.woken', $2, $3, $4, jsonb_build_object('wait', $5::text, 'timed_out', $6::boolean) FROM w`,
		a.key, a.lease.Owner, a.lease.Token, a.job.Attempt, kind, wk.TimedOut)
	if err != nil {
		return nil, nil, fmt.Errorf("run %q: taking its wait: %w", a.key, err)
	}
	return wk, nil, nil
}

// deadlineOf is when the wait w times out, from now.
func (w *waitSpec) deadlineOf(now time.Time) time.Time {
	if !w.deadline.IsZero() {
		return w.deadline
	}
	return now.Add(max(w.timeout, 0))
}

func (w *waitSpec) validate(key string) error {
	switch w.kind {
	case WaitSignal:
		if w.signal == "" || len(w.signal) > 200 {
			return fmt.Errorf("run %q: WaitForSignal: name %q must be 1 to 200 bytes", key, w.signal)
		}
	case WaitChildren:
		for _, k := range w.children {
			if k == "" {
				return fmt.Errorf("run %q: WaitForChildren: an empty child key", key)
			}
		}
	}
	return nil
}

// waitBackstop is maintenance's part for waits (runwait.Backstop): woken waits whose wake was
// lost, and a page of open waits whose condition holds though no satisfier woke them.
func (e *Engine) waitBackstop(ctx context.Context, res *MaintenanceResult) error {
	e.sweepMu.Lock()
	after := e.waitAfter
	e.sweepMu.Unlock()
	var woken []string
	var next string
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		woken, next, err = runwait.Backstop(ctx, tx, after, waitPage, 2*e.cfg.Lease.Milliseconds())
		return err
	})
	if err != nil {
		return fmt.Errorf("waking waits whose wake was lost: %w", err)
	}
	e.sweepMu.Lock()
	e.waitAfter = next
	e.sweepMu.Unlock()
	res.Woken = append(res.Woken, woken...)
	return nil
}

// waitPage is how many open waits one maintenance pass checks for a lost wake.
const waitPage = 100

// beginWait checks a wait a step returned, in the step's transaction. Held already: it is
// recorded as woken at once and the step goes on as Continue, the next step taking it.
// Otherwise the step commits it (enterWait) with the deadline returned.
func (a *attempt[A, C]) beginWait(ctx context.Context, tx pgx.Tx, next Next) (Next, time.Time, error) {
	w := next.wait
	if err := w.validate(a.key); err != nil {
		return next, time.Time{}, err
	}
	held, err := a.checkWait(ctx, tx, w)
	if err != nil {
		return next, time.Time{}, err
	}
	at := w.deadlineOf(time.Now())
	if !held {
		return next, at, nil
	}
	if err := a.enterWait(ctx, tx, w, at, "at_once"); err != nil {
		return next, time.Time{}, err
	}
	a.waitHeld = true
	return Continue(), at, nil
}
