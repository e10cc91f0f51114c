package retention_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/retention"
)

// itemsArgs is a run over Items items, one committed step each; every step writes one row
// of ret_effect in its transaction, so a step done twice shows as a duplicate row.
type itemsArgs struct {
	Items int       `json:"items"`
	Slot  time.Time `json:"slot,omitzero"`
	Shard int       `json:"shard,omitzero"`
}

func (itemsArgs) Kind() string { return "ret_items" }

type itemsCursor struct {
	Next int `json:"next"`
}

// itemsWorker fails its run (workflow.Fail, terminal) at item failAt while failAt >= 0.
type itemsWorker struct {
	workflow.StepperDefaults[itemsArgs, itemsCursor]
	failAt atomic.Int64
}

func (w *itemsWorker) Step(ctx context.Context, s *workflow.Step[itemsArgs, itemsCursor]) (workflow.Next, error) {
	if s.Cursor.Next >= s.Args.Items {
		return workflow.Done(), nil
	}
	if int64(s.Cursor.Next) == w.failAt.Load() {
		return workflow.Fail(fmt.Errorf("item %d: the bank's file is missing", s.Cursor.Next)), nil
	}
	if _, err := s.Tx.Exec(ctx, `INSERT INTO ret_effect (run_key, item) VALUES ($1, $2)`, s.RunKey, s.Cursor.Next); err != nil {
		return workflow.Next{}, err
	}
	s.Cursor.Next++
	return workflow.Continue(), nil
}

type fastRetry struct{}

func (fastRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(50 * time.Millisecond) }

// worked is a database with an engine, the items worker and a started River client.
type worked struct {
	pool   *pgxpool.Pool
	engine *workflow.Engine
	client *river.Client[pgx.Tx]
	worker *itemsWorker
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newWorked(t *testing.T, pool *pgxpool.Pool, install func(rc *river.Config)) *worked {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE ret_effect (id bigserial PRIMARY KEY, run_key text NOT NULL, item int NOT NULL)`)
	require.NoError(t, err)
	engine, err := workflow.New(pool, &workflow.Config{Lease: 2 * time.Second, Logger: quiet()})
	require.NoError(t, err)
	w := &worked{pool: pool, engine: engine, worker: &itemsWorker{}}
	w.worker.failAt.Store(-1)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, w.worker)
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		RetryPolicy:       fastRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quiet(),
	}
	require.NoError(t, engine.Install(rc))
	if install != nil {
		install(rc)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	require.NoError(t, client.Start(cctx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	w.client = client
	return w
}

func (w *worked) waitRun(t *testing.T, key string, statuses ...workflow.RunStatus) *workflow.Run {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := workflow.GetRun(context.Background(), w.pool, key)
		require.NoError(t, err)
		for _, s := range statuses {
			if run.Status == s {
				return run
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %q is %s after 30s, want one of %v", key, run.Status, statuses)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// effects returns how often each item of a run was written.
func (w *worked) effects(t *testing.T, key string) map[int]int {
	t.Helper()
	rows, err := w.pool.Query(context.Background(), `SELECT item, count(*)::int FROM ret_effect WHERE run_key = $1 GROUP BY item`, key)
	require.NoError(t, err)
	out := map[int]int{}
	for rows.Next() {
		var item, n int
		require.NoError(t, rows.Scan(&item, &n))
		out[item] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// month is how far Prune's clock is moved ahead: everything written so far is old.
const month = 30 * 24 * time.Hour

func pruneAMonthLater(t *testing.T, pool *pgxpool.Pool, cfg retention.Config) *retention.Result {
	t.Helper()
	cfg.OlderThan = 7 * 24 * time.Hour
	cfg.Now = func() time.Time { return time.Now().Add(month) }
	cfg.Pause = time.Millisecond
	res, err := retention.Prune(context.Background(), pool, &cfg)
	require.NoError(t, err)
	t.Logf("pruned a month later: %+v", res)
	return res
}

// Defect: retention forgot run keys. Prune deleted a failed run with its checkpoint; Resume
// then said not found, and Start with the same key created a new run from cursor zero that
// redid the committed steps. A key names one run forever: after any Prune, Start of a used
// key returns that run, and a failed run resumes from its last committed cursor.
func TestPruneKeepsRunKeysAndResumability(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorked(t, testkit.DB(t), nil)
	w.worker.failAt.Store(2)
	const key = "settle/2026-11-28/0"
	args := itemsArgs{Items: 4}
	run, err := workflow.Start(ctx, w.client, key, args, nil)
	require.NoError(t, err)
	require.True(t, run.Created)
	w.waitRun(t, key, workflow.RunStatusFailed)
	require.Equal(t, map[int]int{0: 1, 1: 1}, w.effects(t, key), "two items committed before the failure")

	// A succeeded run of another key, whose history retention may prune.
	done := "settle/2026-11-27/0"
	w.worker.failAt.Store(-1)
	_, err = workflow.Start(ctx, w.client, done, args, nil)
	require.NoError(t, err)
	w.waitRun(t, done, workflow.RunStatusSucceeded)
	w.worker.failAt.Store(2)

	pruneAMonthLater(t, w.pool, retention.Config{})

	// The failed run is still there, with its cursor: it can be resumed.
	got, err := workflow.GetRun(ctx, w.pool, key)
	if assert.NoError(t, err, "retention forgot failed run %q", key) {
		require.Equal(t, workflow.RunStatusFailed, got.Status)
	}

	// Start with the used key is the same run, not a new one from cursor zero.
	again, err := workflow.Start(ctx, w.client, key, args, nil)
	require.NoError(t, err)
	assert.False(t, again.Created, "Start after Prune created a new run %q from cursor zero", key)
	again, err = workflow.Start(ctx, w.client, done, args, nil)
	require.NoError(t, err)
	assert.False(t, again.Created, "Start after Prune created a new run %q: its committed steps would run again", done)
	require.Equal(t, workflow.RunStatusSucceeded, again.Status)
	require.NotNil(t, again.HistoryPrunedAt, "the succeeded run's history was pruned, and it says so")

	w.worker.failAt.Store(-1)
	// Alice resumes the run she reads now (what stepwise.Client.RunResume does).
	assert.NoError(t, pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		run, err := workflow.GetRun(ctx, tx, key)
		if err != nil {
			return err
		}
		_, err = workflow.ResumeTx(ctx, w.client, tx, key, run.Version, "alice", "TICKET-9: the bank's file arrived")
		return err
	}))
	w.waitRun(t, key, workflow.RunStatusSucceeded)
	w.waitRun(t, done, workflow.RunStatusSucceeded)
	require.Equal(t, map[int]int{0: 1, 1: 1, 2: 1, 3: 1}, w.effects(t, key), "every item once: nothing redone")
	require.Equal(t, map[int]int{0: 1, 1: 1, 2: 1, 3: 1}, w.effects(t, done))

	// A month later again: the resumed run's history goes, but who resumed it and why stay.
	pruneAMonthLater(t, w.pool, retention.Config{})
	require.Equal(t, 1, count(t, w.pool, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind = 'run.resume'
		AND actor = 'alice' AND detail->>'reason' = 'TICKET-9: the bank''s file arrived'`, key))
	require.Zero(t, count(t, w.pool, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind = 'lease.claim'`, key))
	again, err = workflow.Start(ctx, w.client, key, args, nil)
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, workflow.RunStatusSucceeded, again.Status)
}

// A failed or cancelled run is resumable, so its history (why it failed) stays until the
// operator names it; a named run's history goes, and the run itself (its key and cursor)
// still stays. Naming a run that is not failed or cancelled, or not there, is refused before
// anything is deleted.
func TestPruneFailedRunsOnlyByName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	old := time.Now().Add(-10 * 24 * time.Hour)
	history(t, pool, "f/1", "failed", old, "")
	history(t, pool, "f/2", "cancelled", old, "")
	history(t, pool, "f/3", "failed", old, "MANUAL")
	history(t, pool, "live", "running", old, "")
	cfg := func(names ...string) *retention.Config {
		return &retention.Config{OlderThan: 7 * 24 * time.Hour, FailedRuns: names}
	}
	res, err := retention.Prune(ctx, pool, cfg())
	require.NoError(t, err)
	require.Zero(t, res.Total(), "failed and cancelled runs are resumable: kept whole unless named")

	_, err = retention.Prune(ctx, pool, cfg("f/1", "live"))
	require.ErrorContains(t, err, `run "live" is running; only a failed or cancelled run`)
	_, err = retention.Prune(ctx, pool, cfg("nope"))
	require.ErrorContains(t, err, `there is no run "nope"`)
	_, err = retention.Prune(ctx, pool, cfg("f/3"))
	require.ErrorContains(t, err, `run "f/3" wrote operations that are not settled yet`)
	require.Equal(t, 10, count(t, pool, `SELECT count(*) FROM stepwise_event`), "a refused Prune deletes nothing")

	res, err = retention.Prune(ctx, pool, cfg("f/1"))
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Runs)
	require.EqualValues(t, 2, res.RunEvents)
	require.Equal(t, []string{"f/1", "f/2", "f/3", "live"}, keys(t, pool), "runs are never deleted")
	run, err := workflow.GetRun(ctx, pool, "f/1")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
	require.NotNil(t, run.HistoryPrunedAt)
	require.Equal(t, 4, count(t, pool, `SELECT count(*) FROM stepwise_checkpoint`))
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'f/2'`), "an unnamed failed run keeps its history")

	res, err = retention.Prune(ctx, pool, cfg("f/1"))
	require.NoError(t, err)
	require.Zero(t, res.Total(), "a second pass finds nothing")
}

// Defect: retention erased slot evidence. Prune kept a schedule's newest slot row but deleted
// the slot's runs: the COMPLETED slot then reported FAILED (runs missing), and StartSlot ran
// it again, settling the date a second time. After Prune the slot is still COMPLETED, and
// StartSlot finds its runs.
func TestPruneKeepsSlotEvidence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	day := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	sch := schedule.Schedule[itemsArgs]{Name: "settle", Spec: "0 1 * * *", Zone: "UTC", Shards: 2,
		Misfire: schedule.CatchUpAll{}, Overlap: schedule.OverlapAllowAll,
		Args: func(slot time.Time, shard int) itemsArgs { return itemsArgs{Items: 3, Slot: slot, Shard: shard} }}
	var clock atomic.Pointer[time.Time]
	setClock := func(t time.Time) { clock.Store(&t) }
	setClock(day.Add(-time.Hour))
	w := newWorked(t, pool, nil)
	sched, err := schedule.New(w.engine, &schedule.Config{Now: func() time.Time { return *clock.Load() }})
	require.NoError(t, err)
	require.NoError(t, schedule.Add(sched, sch))
	tick := func() *schedule.TickOutcome {
		res, err := sched.Tick(ctx, w.client)
		require.NoError(t, err)
		return res.Schedule("settle")
	}
	tick()
	setClock(day.Add(time.Minute))
	require.Equal(t, []time.Time{day}, tick().Materialized)
	for shard := range 2 {
		w.waitRun(t, schedule.RunKey("settle", day, shard), workflow.RunStatusSucceeded)
	}
	executions := func() int { return count(t, pool, `SELECT count(*) FROM ret_effect`) }
	require.Equal(t, 6, executions())
	setClock(day.Add(2 * time.Minute))
	tick() // sees the slot's runs done
	rep, err := operator(t, pool).SlotGet(ctx, "settle", day)
	require.NoError(t, err)
	require.Equal(t, schedule.BatchCompleted, rep.Status)
	require.NotNil(t, rep.RunsDoneAt)

	pruneAMonthLater(t, pool, retention.Config{})

	rep, err = operator(t, pool).SlotGet(ctx, "settle", day)
	require.NoError(t, err)
	assert.Equal(t, schedule.BatchCompleted, rep.Status, "the settled slot after Prune: runs %v", rep.Runs)

	// The operator re-runs the date by hand: nothing runs again.
	var runs []*workflow.Run
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		runs, err = schedule.StartSlot(ctx, w.client, tx, sch, day, "ops")
		return err
	}))
	for _, r := range runs {
		assert.False(t, r.Created, "StartSlot after Prune started run %q again", r.Key)
	}
	time.Sleep(500 * time.Millisecond) // a run started again would have stepped by now
	for _, r := range runs {
		w.waitRun(t, r.Key, workflow.RunStatusSucceeded)
	}
	require.Equal(t, 6, executions(), "the date was settled a second time")

	// A database pruned by an earlier retention (the slot's runs deleted with their
	// checkpoints, as it did): StartSlot refuses the slot instead of settling it again.
	_, err = pool.Exec(ctx, `WITH r AS (DELETE FROM stepwise_run WHERE schedule = 'settle' RETURNING key)
		DELETE FROM stepwise_checkpoint WHERE key IN (SELECT key FROM r)`)
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := schedule.StartSlot(ctx, w.client, tx, sch, day, "ops")
		return err
	})
	require.ErrorIs(t, err, schedule.ErrSlotRunsMissing)
	require.ErrorContains(t, err, `slot 2026-11-28T01:00:00Z was materialized with 2 runs and 2 of them are gone`)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 6, executions())
}

// Defect: retention erased who decided. The resolver's op.transition and the console's
// console.action rows went with the operation's audit trail: nothing showed who marked a
// payout SUCCEEDED by hand, or why. A person's decision is kept as long as the operation.
func TestPruneKeepsWhoDecided(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	discard := slog.New(slog.DiscardHandler)
	ob, err := outbox.New(pool, &outbox.Config{ID: "test", Logger: discard, Kinds: map[string]*outbox.KindConfig{
		"payout": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			return outbox.Receipt{}, nil
		})},
	}})
	require.NoError(t, err)
	require.NoError(t, ob.Register(ctx))
	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: ob, Logger: discard, Kinds: map[string]*reconcile.KindConfig{
		"payout": {Checker: reconcile.CheckerFunc(func(context.Context, *outbox.Operation) (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
		})},
	}})
	require.NoError(t, err)

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.EnqueueParams{Kind: "payout", BusinessKey: "m-0",
			Payload: []byte(`{"account":"acct"}`), Amount: 1000, Currency: "EUR", RunKey: "settle/x/0"})
		return err
	}))
	id := outbox.OperationID("payout", "m-0")
	subject := "op:" + id.String()
	// The dispatcher's and the reconciler's trail up to MANUAL (machine transitions).
	_, err = pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'MANUAL', manual_reason = 'gave up: 5 checks', attempts = 1 WHERE operation_id = $1`, id)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor) VALUES
		($1, 'op.transition', 'PENDING', 'PROCESSING', 'dispatcher-1'),
		($1, 'op.transition', 'PROCESSING', 'UNKNOWN_EXTERNAL', 'dispatcher-1'),
		($1, 'op.transition', 'UNKNOWN_EXTERNAL', 'MANUAL', 'reconciler')`, subject)
	require.NoError(t, err)

	// A person decides, through the resolver and (as the console does) with its audit row.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := rec.ResolveTx(ctx, tx, &reconcile.ResolveOpts{OperationID: id, Outcome: outbox.StateSucceeded,
			ExpectedState: outbox.StateManual, Actor: "alice", Reason: "TICKET-7: the bank confirms the payment", ExternalRef: "bank-77"}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
			VALUES ($1, 'console.action', 'MANUAL', 'SUCCEEDED', 'alice', jsonb_build_object('action', 'op.resolve', 'reason', 'TICKET-7: the bank confirms the payment', 'peer', '127.0.0.1:40000'))`, subject)
		return err
	}))

	res := pruneAMonthLater(t, pool, retention.Config{})
	require.EqualValues(t, 2, res.OperationEvents, "the dispatcher's two machine transitions go")

	var actor, reason string
	var at time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT actor, detail->>'reason', at FROM stepwise_event
		WHERE subject = $1 AND kind = 'op.transition' AND to_state = 'SUCCEEDED'`, subject).Scan(&actor, &reason, &at),
		"who marked the payout SUCCEEDED by hand is gone")
	require.Equal(t, "alice", actor)
	require.Equal(t, "TICKET-7: the bank confirms the payment", reason)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind = 'console.action' AND actor = 'alice'`, subject))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind = 'op.transition' AND to_state = 'MANUAL'`, subject),
		"what the person decided on (why it became MANUAL) stays with the decision")
}
