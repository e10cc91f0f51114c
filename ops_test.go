package stepwise

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// opsEnv is a Client built from its components (as NewClient wires them) on a fresh
// database, with kind "payout" whose outcome callback records each outcome in a business
// table, and kind "refund" registered by another service only.
type opsEnv struct {
	pool *pgxpool.Pool
	c    *Client
}

func newOpsEnv(t *testing.T) *opsEnv {
	t.Helper()
	ctx := context.Background()
	pool := testkit.DB(t)
	discard := slog.New(slog.DiscardHandler)
	_, err := pool.Exec(ctx, `CREATE TABLE payout_outcome (operation_id uuid, to_state text, actor text)`)
	require.NoError(t, err)
	ob, err := outbox.New(pool, &outbox.Config{ID: "ops-test", Logger: discard, Kinds: map[string]*outbox.KindConfig{
		"payout": {
			Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil }),
			OnOutcome: func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, o outbox.Outcome) error {
				_, err := tx.Exec(ctx, `INSERT INTO payout_outcome VALUES ($1, $2, $3)`, op.ID, string(o.To), o.Actor)
				return err
			},
		},
	}})
	require.NoError(t, err)
	require.NoError(t, ob.Register(ctx))
	// "refund" is another service's kind: registered in the database, unknown to this client.
	other, err := outbox.New(pool, &outbox.Config{ID: "other", Logger: discard, Kinds: map[string]*outbox.KindConfig{
		"refund": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil })},
	}})
	require.NoError(t, err)
	require.NoError(t, other.Register(ctx))
	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: ob, Logger: discard, Kinds: map[string]*reconcile.KindConfig{
		"payout": {Checker: reconcile.CheckerFunc(func(context.Context, *outbox.Operation) (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
		})},
	}})
	require.NoError(t, err)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: discard})
	require.NoError(t, err)
	engine, err := workflow.New(pool, &workflow.Config{Logger: discard})
	require.NoError(t, err)
	return &opsEnv{pool: pool, c: &Client{pool: pool, river: rc, engine: engine, outbox: ob, reconciler: rec, resolver: rec}}
}

// addRun writes a run and its checkpoint as workflow.Start and a worker would leave them.
func (e *opsEnv) addRun(t *testing.T, key string, status workflow.RunStatus) {
	t.Helper()
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key, cursor, fencing_token, steps) VALUES ($1, '{"next":7}', 3, 7)`, key)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, status) VALUES ($1, 'settle', '{}', $2)`, key, status)
	require.NoError(t, err)
}

// enqueueManual writes an operation of kind and puts it in MANUAL (test data, as the outbox
// would have left it), and returns its id and version.
func (e *opsEnv) enqueueManual(t *testing.T, kind, bk, runKey string) (uuid.UUID, int64) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.EnqueueParams{Kind: kind, BusinessKey: bk, Payload: []byte(`{}`), Amount: 100, Currency: "EUR", RunKey: runKey})
		return err
	}))
	id := outbox.OperationID(kind, bk)
	_, err := e.pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'MANUAL', manual_reason = 'gave up', attempts = 1, last_sent_at = now() WHERE operation_id = $1`, id)
	require.NoError(t, err)
	op, err := e.c.OperationGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StateManual, op.State)
	return id, op.Version
}

func (e *opsEnv) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// snapshot is what an action must not change when refused: the runs, the operations, the
// events and River's jobs.
func (e *opsEnv) snapshot(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT
		(SELECT coalesce(string_agg(key || ' ' || status || ' ' || version || ' ' || coalesce(cancel_requested_at::text, '-'), ',' ORDER BY key), '') FROM stepwise_run) || ' | ' ||
		(SELECT coalesce(string_agg(operation_id::text || ' ' || state || ' ' || version, ',' ORDER BY operation_id), '') FROM stepwise_operation) || ' | ' ||
		(SELECT count(*) FROM stepwise_event) || ' events | ' || (SELECT count(*) FROM river_job) || ' jobs | ' ||
		(SELECT count(*) FROM payout_outcome) || ' outcomes'`).Scan(&s))
	return s
}

func TestRunGetAndList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t)
	e.addRun(t, "settle/a", workflow.RunStatusFailed)
	e.addRun(t, "settle/b", workflow.RunStatusRunning)
	e.addRun(t, "other/c", workflow.RunStatusFailed)

	run, err := e.c.RunGet(ctx, "settle/a")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		run, err := e.c.RunGetTx(ctx, tx, "settle/b")
		require.NoError(t, err)
		require.Equal(t, workflow.RunStatusRunning, run.Status)
		return nil
	}))
	_, err = e.c.RunGet(ctx, "nope")
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	require.ErrorIs(t, err, stepwisetype.ErrNotFound, "the package's own sentinel still matches")

	runs, err := e.c.RunList(ctx, &RunListParams{Status: workflow.RunStatusFailed})
	require.NoError(t, err)
	require.Len(t, runs, 2)
	runs, err = e.c.RunList(ctx, &RunListParams{KeyPrefix: "settle/", Status: workflow.RunStatusFailed})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, "settle/a", runs[0].Key)
	require.Equal(t, int64(7), runs[0].Steps, "the steps its checkpoint committed")
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		runs, err := e.c.RunListTx(ctx, tx, nil)
		require.NoError(t, err)
		require.Len(t, runs, 3)
		return nil
	}))
	_, err = e.c.RunList(ctx, &RunListParams{Status: "broken"})
	require.ErrorContains(t, err, "want pending, running")
}

// TestRunCancel: a cancel is refused when the run moved since the version the person saw and
// changes nothing; it is recorded with actor and reason; the Tx variant commits with the
// caller's transaction; a finished run is refused.
func TestRunCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t)
	e.addRun(t, "settle/live", workflow.RunStatusPending)
	e.addRun(t, "settle/done", workflow.RunStatusSucceeded)
	seen, err := e.c.RunGet(ctx, "settle/live")
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'running' WHERE key = 'settle/live'`)
	require.NoError(t, err)

	before := e.snapshot(t)
	_, err = e.c.RunCancel(ctx, "settle/live", &RunCancelOpts{Actor: "ana", Reason: "wrong date", ExpectedVersion: seen.Version})
	require.ErrorIs(t, err, stepwisetype.ErrChanged)
	require.ErrorIs(t, err, stepwisetype.ErrChanged)
	require.ErrorContains(t, err, "it is running now")
	require.Equal(t, before, e.snapshot(t), "a refused cancel changes nothing")

	_, err = e.c.RunCancel(ctx, "settle/live", &RunCancelOpts{Actor: "ana"})
	require.ErrorContains(t, err, "Reason is empty")
	_, err = e.c.RunCancel(ctx, "settle/live", &RunCancelOpts{Actor: "ana\u202e", Reason: "x"})
	require.ErrorContains(t, err, "Actor")
	_, err = e.c.RunCancel(ctx, "nope", &RunCancelOpts{Actor: "ana", Reason: "x"})
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	_, err = e.c.RunCancel(ctx, "settle/done", &RunCancelOpts{Actor: "ana", Reason: "x"})
	require.ErrorIs(t, err, ErrRunNotCancellable)
	require.Equal(t, before, e.snapshot(t))

	// The Tx variant, rolled back: nothing.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	run, err := e.c.RunCancelTx(ctx, tx, "settle/live", &RunCancelOpts{Actor: "ana", Reason: "wrong date", ExpectedVersion: seen.Version + 1})
	require.NoError(t, err)
	require.NotNil(t, run.CancelRequestedAt)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, before, e.snapshot(t))

	// Unconditional (0): cancels whatever the run is doing now.
	run, err = e.c.RunCancel(ctx, "settle/live", &RunCancelOpts{Actor: "ana", Reason: "wrong date"})
	require.NoError(t, err)
	require.NotNil(t, run.CancelRequestedAt)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM stepwise_event WHERE subject = 'settle/live' AND kind = 'run.cancel_requested'
		AND detail->>'reason' = 'cancelled by ana: wrong date'`))
}

// TestRunResume: a resume needs the version the person saw; a stale one is refused and
// changes nothing (no job either, in the Tx variant committed anyway); the resume is audited
// with actor and reason.
func TestRunResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t)
	e.addRun(t, "settle/x", workflow.RunStatusFailed)
	seen, err := e.c.RunGet(ctx, "settle/x")
	require.NoError(t, err)
	// Someone resumed it meanwhile; it ran and failed again.
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'pending' WHERE key = 'settle/x'`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'failed', last_error = 'account frozen' WHERE key = 'settle/x'`)
	require.NoError(t, err)

	before := e.snapshot(t)
	_, err = e.c.RunResume(ctx, "settle/x", &RunResumeOpts{Actor: "ana", Reason: "bank back"})
	require.ErrorContains(t, err, "never unconditional")
	_, err = e.c.RunResume(ctx, "settle/x", &RunResumeOpts{Actor: "ana", Reason: "bank back", ExpectedVersion: seen.Version})
	require.ErrorIs(t, err, stepwisetype.ErrChanged)
	require.ErrorIs(t, err, stepwisetype.ErrChanged)
	require.ErrorContains(t, err, "account frozen", "the refusal says what the run is now")
	require.Equal(t, before, e.snapshot(t), "a refused resume changes nothing")

	// The Tx variant refused, and the caller commits anyway: no orphan job.
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := e.c.RunResumeTx(ctx, tx, "settle/x", &RunResumeOpts{Actor: "ana", Reason: "bank back", ExpectedVersion: seen.Version})
		require.ErrorIs(t, err, stepwisetype.ErrChanged)
		return nil
	}))
	require.Equal(t, before, e.snapshot(t))
	_, err = e.c.RunResume(ctx, "nope", &RunResumeOpts{Actor: "ana", Reason: "x", ExpectedVersion: 1})
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)

	now, err := e.c.RunGet(ctx, "settle/x")
	require.NoError(t, err)
	// The Tx variant rolled back: nothing.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := e.c.RunResumeTx(ctx, tx, "settle/x", &RunResumeOpts{Actor: "ana", Reason: "bank back", ExpectedVersion: now.Version})
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusPending, res.Run.Status)
	require.Empty(t, res.LeftAsTheyAre, "no descendants")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, before, e.snapshot(t))

	res, err = e.c.RunResume(ctx, "settle/x", &RunResumeOpts{Actor: "ana", Reason: "INC-7: bank back", ExpectedVersion: now.Version})
	require.NoError(t, err)
	run := res.Run
	require.Equal(t, workflow.RunStatusPending, run.Status)
	require.NotNil(t, run.RiverJobID)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM stepwise_event WHERE subject = 'settle/x' AND kind = 'run.resume' AND actor = 'ana'
		AND detail->>'reason' = 'INC-7: bank back' AND (detail->>'seen_version')::bigint = $1`, now.Version))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE kind = 'settle'`))

	_, err = e.c.RunResume(ctx, "settle/x", &RunResumeOpts{Actor: "ana", Reason: "again", ExpectedVersion: run.Version})
	require.ErrorIs(t, err, workflow.ErrRunNotResumable, "a pending run is not resumed")
}

// TestOperationResolve: a resolution needs the version the person saw; a stale one is refused
// and changes nothing (no callback); a resolution runs the kind's callback in its
// transaction and is audited with actor and reason; a kind the client lacks is refused
// unless NoCallback says it has no callback.
func TestOperationResolve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t)
	id, version := e.enqueueManual(t, "payout", "p-1", "settle/x")
	e.enqueueManual(t, "payout", "p-2", "settle/y")

	op, err := e.c.OperationGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "p-1", op.BusinessKey)
	_, err = e.c.OperationGet(ctx, uuid.New())
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	ops, err := e.c.OperationList(ctx, &OperationListParams{State: outbox.StateManual})
	require.NoError(t, err)
	require.Len(t, ops, 2)
	ops, err = e.c.OperationList(ctx, &OperationListParams{RunKey: "settle/x"})
	require.NoError(t, err)
	require.Len(t, ops, 1)
	_, err = e.c.OperationList(ctx, &OperationListParams{})
	require.ErrorContains(t, err, "State is required")
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'SUCCEEDED', created_at = created_at + interval '1 second' WHERE business_key = 'p-2'`)
	require.NoError(t, err)
	ops, err = e.c.OperationList(ctx, &OperationListParams{NewestFirst: true})
	require.NoError(t, err)
	require.Len(t, ops, 2, "any state")
	require.Equal(t, []string{"p-2", "p-1"}, []string{ops[0].BusinessKey, ops[1].BusinessKey}, "newest first")
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'MANUAL' WHERE business_key = 'p-2'`)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		op, err := e.c.OperationGetTx(ctx, tx, id)
		require.NoError(t, err)
		require.Equal(t, version, op.Version)
		ops, err := e.c.OperationListTx(ctx, tx, &OperationListParams{BusinessKey: "p-2"})
		require.NoError(t, err)
		require.Len(t, ops, 1)
		reqs, err := e.c.OperationRequestListTx(ctx, tx, id)
		require.NoError(t, err)
		require.Empty(t, reqs)
		return nil
	}))
	reqs, err := e.c.OperationRequestList(ctx, id)
	require.NoError(t, err)
	require.Empty(t, reqs)

	// Moved since the person saw it, and back to MANUAL (ABA).
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'RETRYABLE' WHERE operation_id = $1`, id)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'MANUAL', manual_reason = 'the bank holds another amount' WHERE operation_id = $1`, id)
	require.NoError(t, err)
	before := e.snapshot(t)
	resolve := &OperationResolveOpts{Outcome: outbox.StateFailedPermanent, ExpectedVersion: version, Actor: "ana", Reason: "TICKET-1: never sent"}
	_, err = e.c.OperationResolve(ctx, id, resolve)
	require.ErrorIs(t, err, stepwisetype.ErrChanged)
	require.ErrorIs(t, err, stepwisetype.ErrChanged)
	require.Equal(t, before, e.snapshot(t), "a refused resolution changes nothing and runs no callback")
	_, err = e.c.OperationResolve(ctx, id, &OperationResolveOpts{Outcome: outbox.StateSucceeded, Actor: "ana", Reason: "x"})
	require.ErrorIs(t, err, reconcile.ErrInvalidResolution)
	require.ErrorContains(t, err, "never unconditional")
	_, err = e.c.OperationResolve(ctx, uuid.New(), &OperationResolveOpts{Outcome: outbox.StateSucceeded, ExpectedVersion: 1, Actor: "ana", Reason: "x"})
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	require.Equal(t, before, e.snapshot(t))

	now, err := e.c.OperationGet(ctx, id)
	require.NoError(t, err)
	// The Tx variant rolled back: nothing, its callback's write included.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	done, err := e.c.OperationResolveTx(ctx, tx, id, &OperationResolveOpts{Outcome: outbox.StateSucceeded, ExpectedVersion: now.Version, Actor: "ana", Reason: "TICKET-2"})
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, done.State)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, before, e.snapshot(t))

	done, err = e.c.OperationResolve(ctx, id, &OperationResolveOpts{Outcome: outbox.StateSucceeded, ExpectedVersion: now.Version, Actor: "ana", Reason: "TICKET-2: the bank paid", ExternalRef: "BANK-9"})
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, done.State)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM payout_outcome WHERE operation_id = $1 AND to_state = 'SUCCEEDED' AND actor = 'ana'`, id),
		"the kind's callback ran in the resolution's transaction")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND actor = 'ana' AND to_state = 'SUCCEEDED'
		AND detail->>'reason' = 'TICKET-2: the bank paid'`, "op:"+id.String()))

	// Another service's kind: refused without NoCallback, resolved with it.
	rid, rv := e.enqueueManual(t, "refund", "r-1", "")
	before = e.snapshot(t)
	_, err = e.c.OperationResolve(ctx, rid, &OperationResolveOpts{Outcome: outbox.StateRetryable, ExpectedVersion: rv, Actor: "ana", Reason: "send again"})
	require.ErrorIs(t, err, errKindWithoutConfig)
	require.ErrorIs(t, err, outbox.ErrUnknownKind)
	require.Equal(t, before, e.snapshot(t))
	done, err = e.c.OperationResolve(ctx, rid, &OperationResolveOpts{Outcome: outbox.StateRetryable, ExpectedVersion: rv, Actor: "ana", Reason: "send again", NoCallback: true})
	require.NoError(t, err)
	require.Equal(t, outbox.StateRetryable, done.State)

	// A client without kinds of its own resolves another service's kind too: its River
	// client has no dispatcher worker, so River would refuse the RETRYABLE decision's wake
	// (and roll the decision back) unless it goes through an insert-only client.
	rid, rv = e.enqueueManual(t, "refund", "r-2", "")
	bare, err := NewClient(e.pool, &Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	done, err = bare.OperationResolve(ctx, rid, &OperationResolveOpts{Outcome: outbox.StateRetryable, ExpectedVersion: rv, Actor: "ana", Reason: "send again", NoCallback: true})
	require.NoError(t, err)
	require.Equal(t, outbox.StateRetryable, done.State)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_outbox_dispatch' AND args->>'operation_kind' = 'refund'`),
		"the decision queued the kind's dispatcher")
}

// TestSchedulePauseAndSlots: pause and resume are audited with actor and reason (the Tx
// variant with the caller's transaction); slots are listed; unknown names match ErrNotFound.
func TestSchedulePauseAndSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t)
	_, err := e.pool.Exec(ctx, `INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
		VALUES ('nightly', '0 1 * * *', 'UTC', 'run_after', '{}', 'buffer_all', 1, '2026-11-29T01:00:00Z')`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO stepwise_schedule_slot (schedule, slot, status, reason, detail, shards, version, materialized_at) VALUES
		('nightly', '2026-11-28T01:00:00Z', 'skipped', 'misfire_deadline', 'later than the starting deadline', 1, 1, NULL),
		('nightly', '2026-11-29T01:00:00Z', 'materialized', NULL, NULL, 1, 1, now())`)
	require.NoError(t, err)

	list, err := e.c.ScheduleList(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "nightly", list[0].Name)
	require.Equal(t, "0 1 * * *", list[0].Spec)
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		list, err := e.c.ScheduleListTx(ctx, tx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		return nil
	}))

	require.ErrorContains(t, e.c.SchedulePause(ctx, "nightly", &SchedulePauseOpts{Actor: "ana"}), "Reason is empty")
	err = e.c.SchedulePause(ctx, "nope", &SchedulePauseOpts{Actor: "ana", Reason: "x"})
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, e.c.SchedulePauseTx(ctx, tx, "nightly", &SchedulePauseOpts{Actor: "ana", Reason: "bank holiday"}))
	require.NoError(t, tx.Rollback(ctx))
	info, err := e.c.ScheduleGet(ctx, "nightly")
	require.NoError(t, err)
	require.False(t, info.Paused, "rolled back with the caller's transaction")

	require.NoError(t, e.c.SchedulePause(ctx, "nightly", &SchedulePauseOpts{Actor: "ana", Reason: "bank holiday"}))
	require.NoError(t, e.c.SchedulePause(ctx, "nightly", &SchedulePauseOpts{Actor: "ana", Reason: "again"}), "pausing a paused schedule does nothing")
	info, err = e.c.ScheduleGet(ctx, "nightly")
	require.NoError(t, err)
	require.True(t, info.Paused)
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return e.c.ScheduleResumeTx(ctx, tx, "nightly", &SchedulePauseOpts{Actor: "bo", Reason: "holiday over"})
	}))
	require.NoError(t, e.c.ScheduleResume(ctx, "nightly", &SchedulePauseOpts{Actor: "bo", Reason: "again"}))
	require.Equal(t, []string{"schedule.paused ana bank holiday", "schedule.resumed bo holiday over"}, e.strings(t,
		`SELECT kind || ' ' || actor || ' ' || (detail->>'reason') FROM stepwise_event WHERE subject = 'schedule:nightly' ORDER BY id`))

	slots, err := e.c.SlotList(ctx, "nightly", nil)
	require.NoError(t, err)
	require.Len(t, slots, 2)
	require.Equal(t, schedule.BatchFailed, slots[0].Status, "a materialized slot without its run")
	require.Equal(t, schedule.BatchSkipped, slots[1].Status)
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		slots, err := e.c.SlotListTx(ctx, tx, "nightly", &SlotListParams{Limit: 1})
		require.NoError(t, err)
		require.Len(t, slots, 1)
		s, err := e.c.SlotGetTx(ctx, tx, "nightly", slots[0].Slot)
		require.NoError(t, err)
		require.Equal(t, slots[0].Status, s.Status)
		return nil
	}))
	_, err = e.c.SlotList(ctx, "nope", nil)
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	_, err = e.c.SlotGet(ctx, "nightly", slots[0].Slot.Add(time.Hour))
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)
}

func (e *opsEnv) strings(t *testing.T, sql string) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), sql)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// TestNewOperatorClient: the operator's client resolves only with NoCallback, and resumes
// through its insert-only River client.
func TestNewOperatorClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t)
	oc, err := NewOperatorClient(e.pool)
	require.NoError(t, err)
	id, v := e.enqueueManual(t, "payout", "p-1", "")
	_, err = oc.OperationResolve(ctx, id, &OperationResolveOpts{Outcome: outbox.StateSucceeded, ExpectedVersion: v, Actor: "ana", Reason: "x"})
	require.ErrorIs(t, err, errKindWithoutConfig)
	e.addRun(t, "settle/x", workflow.RunStatusFailed)
	res, err := oc.RunResume(ctx, "settle/x", &RunResumeOpts{Actor: "ana", Reason: "bank back", ExpectedVersion: 1})
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusPending, res.Run.Status)
	require.Empty(t, oc.OperationKinds())

	// With the kinds the operator says have no callback, it resolves them as they are.
	nc, err := NewOperatorClient(e.pool, "payout")
	require.NoError(t, err)
	require.Equal(t, []string{"payout"}, nc.OperationKinds())
	op, err := nc.OperationResolve(ctx, id, &OperationResolveOpts{Outcome: outbox.StateSucceeded, ExpectedVersion: v, Actor: "ana", Reason: "x"})
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, op.State)
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM payout_outcome`), "the operator's client has no callback for the kind")
	_, err = NewOperatorClient(e.pool, "")
	require.ErrorContains(t, err, "noCallbackKinds")
	_, err = NewOperatorClient(nil)
	require.Error(t, err)
	require.Equal(t, "stepwise: not found", fmt.Sprint(stepwisetype.ErrNotFound))
}

// A kind with a Sender and an outcome callback but no Checker anywhere can only be settled by
// a person: its client resolves it, with the callback, in the same transaction.
func TestOperationResolveOfAKindWithoutChecker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := smallPool(t, 20)
	_, err := pool.Exec(ctx, `CREATE TABLE notice_outcome (operation_id uuid, to_state text)`)
	require.NoError(t, err)
	// A long send timeout (past the reconciler's 5-minute default grace) is no reason to refuse
	// a kind that has no reconciler.
	c, err := NewClient(pool, &Config{Logger: slog.New(slog.DiscardHandler), Kinds: map[string]*KindConfig{
		"notice": {
			Timeout: 10 * time.Minute, Lease: 30 * time.Minute,
			Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil }),
			OnOutcome: func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, o outbox.Outcome) error {
				_, err := tx.Exec(ctx, `INSERT INTO notice_outcome VALUES ($1, $2)`, op.ID, string(o.To))
				return err
			},
		},
	}})
	require.NoError(t, err)
	require.Equal(t, []string{"notice"}, c.OperationKinds())
	require.NoError(t, outbox.RegisterKinds(ctx, pool, "test", "notice"))
	e := &opsEnv{pool: pool, c: c}
	id, version := e.enqueueManual(t, "notice", "n-1", "")

	op, err := c.OperationResolve(ctx, id, &OperationResolveOpts{Outcome: outbox.StateFailedPermanent, ExpectedVersion: version,
		Actor: "alice", Reason: "the customer withdrew"})
	require.NoError(t, err)
	require.Equal(t, outbox.StateFailedPermanent, op.State)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM notice_outcome WHERE operation_id = $1 AND to_state = 'FAILED_PERMANENT'`, id),
		"the kind's callback ran with the decision")
}

// An operator client runs nothing: Start says so, Metrics is empty, and nothing panics.
func TestOperatorClientRunsNothing(t *testing.T) {
	t.Parallel()
	c, err := NewOperatorClient(testkit.DB(t))
	require.NoError(t, err)
	require.ErrorContains(t, c.Start(context.Background()), "operator client")
	require.NoError(t, c.Stop(context.Background()))
	require.Nil(t, c.kindsWithoutChecker())
	require.Empty(t, c.KindStatements())
	ch := make(chan *prometheus.Desc, 10)
	c.Metrics().Describe(ch)
	require.Empty(t, ch)
	_, err = NewOperatorClient(testkit.DB(t), "Bad Kind")
	require.ErrorContains(t, err, `stepwise.NewOperatorClient: noCallbackKinds: invalid operation: kind "Bad Kind"`)
}
