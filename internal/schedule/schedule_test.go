package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/faultpoint"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// The schedule tick's role for subprocess drills. RegisterRole may be called from init
// (testkit.Main runs the role before any test), so this file needs nothing in TestMain.
func init() {
	workflowtest.RegisterRole("schedule-tick-once", runTickOnceRole)
}

// settleArgs is the scheduled test workflow's input.
type settleArgs struct {
	Slot  time.Time `json:"slot"`
	Shard int       `json:"shard"`
}

func (settleArgs) Kind() string { return "test_settle" }

// fakeClock is the schedule's injectable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *fakeClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// t0 is a fixed start for simulated time: a Wednesday, well away from DST switches.
var t0 = time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)

type schedBundle struct {
	pool   *pgxpool.Pool
	engine *workflow.Engine
	client *river.Client[pgx.Tx] // insert-only: runs are inserted, never worked
	sched  *schedule.Scheduler
	clock  *fakeClock
}

// setupScheduler builds a Scheduler on pool with an injected clock at t0 and an insert-only
// River client: enough to check what ticks materialize.
func setupScheduler(t testing.TB, pool *pgxpool.Pool, clock *fakeClock) *schedBundle {
	t.Helper()
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger()})
	require.NoError(t, err)
	if clock == nil {
		clock = newClock(t0)
	}
	sched, err := schedule.New(engine, &schedule.Config{TickInterval: 5 * time.Second, Now: clock.Now})
	require.NoError(t, err)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
	require.NoError(t, err)
	return &schedBundle{pool: pool, engine: engine, client: client, sched: sched, clock: clock}
}

func settleSchedule(name, spec string, misfire schedule.MisfirePolicy, overlap schedule.OverlapPolicy, shards int) schedule.Schedule[settleArgs] {
	return schedule.Schedule[settleArgs]{
		Name: name, Spec: spec, Zone: "UTC", Misfire: misfire, Overlap: overlap, Shards: shards,
		Args: func(slot time.Time, shard int) settleArgs { return settleArgs{Slot: slot, Shard: shard} },
	}
}

func (b *schedBundle) tick(t testing.TB, name string) *schedule.TickOutcome {
	t.Helper()
	res, err := b.sched.Tick(context.Background(), b.client)
	require.NoError(t, err)
	st := res.Schedule(name)
	require.NotNil(t, st, "no result for schedule %q", name)
	return st
}

func queryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// requireOneRunPerSlotShard checks invariant 1 of docs/design.md for a schedule: every
// materialized slot has exactly one run per shard and each run exactly one River job, and
// nothing else exists.
func requireOneRunPerSlotShard(t testing.TB, pool *pgxpool.Pool, schedule string) (slots, runs int) {
	t.Helper()
	slots = queryInt(t, pool, `SELECT count(*) FROM stepwise_schedule_slot WHERE schedule = $1 AND status = 'materialized'`, schedule)
	want := queryInt(t, pool, `SELECT coalesce(sum(shards), 0)::int FROM stepwise_schedule_slot WHERE schedule = $1 AND status = 'materialized'`, schedule)
	runs = queryInt(t, pool, `SELECT count(*) FROM stepwise_run WHERE schedule = $1`, schedule)
	require.Equal(t, want, runs, "runs of %q", schedule)
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM (SELECT slot, shard FROM stepwise_run WHERE schedule = $1
		GROUP BY slot, shard HAVING count(*) > 1) d`, schedule), "duplicate (slot, shard) runs")
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM stepwise_run r LEFT JOIN stepwise_schedule_slot s
		ON s.schedule = r.schedule AND s.slot = r.slot AND s.status = 'materialized'
		WHERE r.schedule = $1 AND s.slot IS NULL`, schedule), "runs of slots not materialized")
	require.Equal(t, runs, queryInt(t, pool, `SELECT count(*) FROM river_job WHERE metadata->>'stepwise_run' LIKE $1 || '/%'`, schedule),
		"one River job per run")
	return slots, runs
}

// Drill 1, in process: the tick commits and then fails before its caller hears back (fault
// point tick-after-commit). The next tick inserts nothing new. Not parallel: fault points
// are per process, and a parallel schedule test would consume the fault.
func TestScheduleTickFailsAfterCommit(t *testing.T) {
	require.NoError(t, faultpoint.Configure(faultpoint.TickAfterCommit+":error@n=1", "1"))
	t.Cleanup(func() { _ = faultpoint.Configure("", "") })
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("drill1", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 3)
	sch.StartAt = t0.Add(-5 * time.Minute)
	require.NoError(t, schedule.Add(b.sched, sch))

	res, err := b.sched.Tick(context.Background(), b.client)
	require.ErrorIs(t, err, faultpoint.ErrInjected)
	require.Len(t, res.Schedule("drill1").Materialized, 6, "the failing tick committed its work before failing")
	slots, runs := requireOneRunPerSlotShard(t, b.pool, "drill1")
	require.Equal(t, 6, slots) // -4m .. 0m, plus -5m itself: StartAt is inclusive
	require.Equal(t, 18, runs)

	st := b.tick(t, "drill1")
	require.Empty(t, st.Materialized)
	require.Zero(t, st.RunsStarted)
	slots, runs = requireOneRunPerSlotShard(t, b.pool, "drill1")
	require.Equal(t, 6, slots)
	require.Equal(t, 18, runs)
}

// runTickOnceRole ticks once in a child process, with the schedule and clock the parent
// passes; the parent arms STEPWISE_FAULTS=tick-after-commit:kill, so it never returns.
func runTickOnceRole(ctx context.Context, env map[string]string) error {
	pool, err := pgxpool.New(ctx, env["STEPWISE_TEST_DB"])
	if err != nil {
		return err
	}
	defer pool.Close()
	now, err := time.Parse(time.RFC3339, env["FAKE_NOW"])
	if err != nil {
		return err
	}
	engine, err := workflow.New(pool, nil)
	if err != nil {
		return err
	}
	sched, err := schedule.New(engine, &schedule.Config{Now: func() time.Time { return now }})
	if err != nil {
		return err
	}
	sch := settleSchedule("drill1", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 3)
	sch.StartAt = t0.Add(-5 * time.Minute)
	if err := schedule.Add(sched, sch); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return err
	}
	fmt.Println("ticking")
	_, err = sched.Tick(ctx, client)
	fmt.Println("tick returned", err)
	return err
}

// Drill 1 with a real crash: a child process ticks and is killed (SIGKILL) right after its
// tick committed. The parent's tick from the same watermark adds nothing.
func TestScheduleTickKilledAfterCommit(t *testing.T) {
	t.Parallel()
	url := testkit.DBURL(t)
	child := workflowtest.Start(t, "schedule-tick-once",
		"STEPWISE_FAULTS="+faultpoint.TickAfterCommit+":kill",
		"STEPWISE_TEST_DB="+url,
		"FAKE_NOW="+t0.Format(time.RFC3339))
	err := child.Wait()
	require.Error(t, err, "the child must have been killed at the fault point")
	require.Contains(t, err.Error(), "killed")
	_, err = child.WaitForLine(context.Background(), "stepwise-fault: tick-after-commit:kill")
	require.NoError(t, err)
	for _, l := range child.Lines() {
		require.NotContains(t, l, "tick returned", "the child got past the fault point")
	}

	b := setupScheduler(t, mustPool(t, url), nil)
	sch := settleSchedule("drill1", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 3)
	sch.StartAt = t0.Add(-5 * time.Minute)
	require.NoError(t, schedule.Add(b.sched, sch))
	slots, runs := requireOneRunPerSlotShard(t, b.pool, "drill1")
	require.Equal(t, 6, slots, "the killed tick's commit is durable")
	require.Equal(t, 18, runs)

	st := b.tick(t, "drill1")
	require.False(t, st.Created)
	require.Empty(t, st.Materialized)
	slots, runs = requireOneRunPerSlotShard(t, b.pool, "drill1")
	require.Equal(t, 6, slots)
	require.Equal(t, 18, runs)
}

// Drill 5: no tick for 10 hours of a per-minute schedule. CatchUpAll materializes the 600
// slots at its configured rate; RunLatest runs one; SkipMissed runs none past its deadline.
// Every slot is recorded either way.
func TestScheduleMisfireDrill(t *testing.T) {
	t.Parallel()
	outage := 10 * time.Hour
	setup := func(t *testing.T, m schedule.MisfirePolicy) *schedBundle {
		b := setupScheduler(t, testkit.DB(t), nil)
		require.NoError(t, schedule.Add(b.sched, settleSchedule("minutely", "* * * * *", m, schedule.OverlapAllowAll, 2)))
		st := b.tick(t, "minutely") // creates the row, watermark t0
		require.True(t, st.Created)
		require.Empty(t, st.Materialized)
		b.clock.Set(t0.Add(outage)) // the scheduler was down for ten hours
		return b
	}
	recorded := func(t *testing.T, b *schedBundle, status, reason string) int {
		return queryInt(t, b.pool, `SELECT count(*) FROM stepwise_schedule_slot
			WHERE schedule = 'minutely' AND status = $1 AND coalesce(reason, '') = $2`, status, reason)
	}

	t.Run("CatchUpAll", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.CatchUpAll{Max: 1000, PerTick: 50})
		var perTick []int
		for range 20 {
			st := b.tick(t, "minutely")
			if len(st.Materialized) == 0 {
				break
			}
			perTick = append(perTick, len(st.Materialized))
			require.LessOrEqual(t, len(st.Materialized), 50, "rate: at most PerTick slots per tick")
			require.Equal(t, 2*len(st.Materialized), st.RunsStarted)
		}
		require.Len(t, perTick, 12, "600 slots at 50 per tick: %v", perTick)
		slots, runs := requireOneRunPerSlotShard(t, b.pool, "minutely")
		require.Equal(t, 600, slots)
		require.Equal(t, 1200, runs)
		require.Zero(t, recorded(t, b, "skipped", schedule.ReasonCatchUpLimit))
		// Every slot but the newest, which was decided on time, was missed by the ticks.
		require.Equal(t, 599.0, counterValue(t, schedule.MetricsForTest(b.sched).Misfires.WithLabelValues("minutely")))
		info, err := operator(t, b.pool).ScheduleGet(context.Background(), "minutely")
		require.NoError(t, err)
		require.Equal(t, t0.Add(outage), info.Watermark)
	})
	t.Run("CatchUpAll beyond Max", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.CatchUpAll{Max: 100, PerTick: 100})
		st := b.tick(t, "minutely")
		require.Len(t, st.Skipped, 500)
		require.Len(t, st.Materialized, 100)
		require.Equal(t, t0.Add(outage-99*time.Minute), st.Materialized[0], "the newest Max slots run")
		require.Equal(t, 500, recorded(t, b, "skipped", schedule.ReasonCatchUpLimit))
		require.Equal(t, 100, recorded(t, b, "materialized", ""))
	})
	t.Run("RunLatest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.RunLatest{})
		st := b.tick(t, "minutely")
		require.Equal(t, []time.Time{t0.Add(outage)}, st.Materialized)
		require.Len(t, st.Skipped, 599)
		require.Equal(t, 599, recorded(t, b, "skipped", schedule.ReasonMisfireRunLatest))
		slots, runs := requireOneRunPerSlotShard(t, b.pool, "minutely")
		require.Equal(t, 1, slots)
		require.Equal(t, 2, runs)
		require.Equal(t, 599.0, counterValue(t, schedule.MetricsForTest(b.sched).SkippedSlots.WithLabelValues("minutely", schedule.ReasonMisfireRunLatest)))
		require.Empty(t, b.tick(t, "minutely").Materialized)
	})
	t.Run("SkipMissed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.SkipMissed{StartingDeadline: 2 * time.Minute})
		st := b.tick(t, "minutely")
		require.Len(t, st.Skipped, 597)
		require.Equal(t, 597, recorded(t, b, "skipped", schedule.ReasonMisfireDeadline))
		require.Len(t, st.Materialized, 3)
		for _, slot := range st.Materialized {
			require.LessOrEqual(t, t0.Add(outage).Sub(slot), 2*time.Minute, "no slot past the deadline runs")
		}
		require.Equal(t, 600, queryInt(t, b.pool, `SELECT count(*) FROM stepwise_schedule_slot WHERE schedule = 'minutely'`), "every slot recorded")
		var reason, detail string
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT reason, detail FROM stepwise_schedule_slot
			WHERE schedule = 'minutely' ORDER BY slot LIMIT 1`).Scan(&reason, &detail))
		require.Equal(t, schedule.ReasonMisfireDeadline, reason)
		require.Contains(t, detail, "StartingDeadline")
	})
}

func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// setRunStatus moves the runs of a slot as a worker would, for overlap tests that only need
// the scheduler's view of "still running" or "finished".
func setRunStatus(t testing.TB, pool *pgxpool.Pool, schedule string, slot time.Time, status workflow.RunStatus) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE stepwise_run SET status = $3,
		finished_at = CASE WHEN $3 IN ('succeeded', 'failed', 'cancelled') THEN now() END
		WHERE schedule = $1 AND slot = $2`, schedule, slot, status)
	require.NoError(t, err)
	require.NotZero(t, tag.RowsAffected())
}

func slotDecision(t testing.TB, pool *pgxpool.Pool, schedule string, slot time.Time) (status, reason string) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT status, coalesce(reason, '') FROM stepwise_schedule_slot
		WHERE schedule = $1 AND slot = $2`, schedule, slot).Scan(&status, &reason))
	return status, reason
}

// Each overlap policy, with the runs of slot A still running when slots B and C come due.
func TestScheduleOverlap(t *testing.T) {
	t.Parallel()
	a, bSlot, c := t0.Add(time.Minute), t0.Add(2*time.Minute), t0.Add(3*time.Minute)
	setup := func(t *testing.T, overlap schedule.OverlapPolicy) *schedBundle {
		b := setupScheduler(t, testkit.DB(t), nil)
		require.NoError(t, schedule.Add(b.sched, settleSchedule("ov", "* * * * *", schedule.CatchUpAll{}, overlap, 2)))
		b.tick(t, "ov")
		b.clock.Set(a)
		require.Equal(t, []time.Time{a}, b.tick(t, "ov").Materialized)
		setRunStatus(t, b.pool, "ov", a, workflow.RunStatusRunning) // A is still going...
		b.clock.Set(bSlot)                                          // ...when B comes due
		return b
	}

	t.Run("AllowAll", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.OverlapAllowAll)
		require.Equal(t, []time.Time{bSlot}, b.tick(t, "ov").Materialized)
		requireOneRunPerSlotShard(t, b.pool, "ov")
	})
	t.Run("Skip", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.OverlapSkip)
		st := b.tick(t, "ov")
		require.Empty(t, st.Materialized)
		require.Equal(t, []schedule.SkippedSlot{{Slot: bSlot, Reason: schedule.ReasonOverlapSkip}}, st.Skipped)
		setRunStatus(t, b.pool, "ov", a, workflow.RunStatusSucceeded)
		b.clock.Set(c)
		require.Equal(t, []time.Time{c}, b.tick(t, "ov").Materialized, "the next slot after A finished runs")
	})
	t.Run("BufferOne", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.OverlapBufferOne)
		require.Equal(t, []time.Time{bSlot}, b.tick(t, "ov").Buffered)
		b.clock.Set(c)
		st := b.tick(t, "ov")
		require.Equal(t, []schedule.SkippedSlot{{Slot: c, Reason: schedule.ReasonOverlapBufferFull}}, st.Skipped)
		setRunStatus(t, b.pool, "ov", a, workflow.RunStatusSucceeded)
		b.clock.Add(time.Second)
		require.Equal(t, []time.Time{bSlot}, b.tick(t, "ov").Materialized, "the buffered slot starts once A ended")
		requireOneRunPerSlotShard(t, b.pool, "ov")
	})
	t.Run("BufferAll", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.OverlapBufferAll)
		require.Equal(t, []time.Time{bSlot}, b.tick(t, "ov").Buffered)
		b.clock.Set(c)
		require.Equal(t, []time.Time{c}, b.tick(t, "ov").Buffered)
		b.clock.Add(time.Second)
		require.Empty(t, b.tick(t, "ov").Materialized, "A still runs")

		setRunStatus(t, b.pool, "ov", a, workflow.RunStatusFailed) // finished, even if badly
		require.Equal(t, []time.Time{bSlot}, b.tick(t, "ov").Materialized, "strictly serial: B, not C")
		require.Empty(t, b.tick(t, "ov").Materialized, "C waits for B")
		setRunStatus(t, b.pool, "ov", bSlot, workflow.RunStatusSucceeded)
		require.Equal(t, []time.Time{c}, b.tick(t, "ov").Materialized)
		requireOneRunPerSlotShard(t, b.pool, "ov")
		rep, err := operator(t, b.pool).SlotGet(context.Background(), "ov", a)
		require.NoError(t, err)
		require.Equal(t, schedule.BatchFailed, rep.Status)
	})
	t.Run("CancelOther", func(t *testing.T) {
		t.Parallel()
		b := setup(t, schedule.OverlapCancelOther)
		st := b.tick(t, "ov")
		require.Equal(t, []time.Time{bSlot}, st.Buffered, "B waits until A's runs have ended")
		require.Equal(t, []string{schedule.RunKey("ov", a, 0), schedule.RunKey("ov", a, 1)}, st.CancelRequested)
		for shard := range 2 {
			run, err := workflow.GetRun(context.Background(), b.pool, schedule.RunKey("ov", a, shard))
			require.NoError(t, err)
			require.NotNil(t, run.CancelRequestedAt)
			require.Contains(t, *run.LastError, "OverlapCancelOther")
		}
		require.Empty(t, b.tick(t, "ov").CancelRequested, "cancellation is requested once")

		b.clock.Set(c) // C comes while B still waits: B is superseded
		st = b.tick(t, "ov")
		require.Equal(t, []schedule.SkippedSlot{{Slot: bSlot, Reason: schedule.ReasonOverlapSuperseded}}, st.Skipped)
		require.Equal(t, []time.Time{c}, st.Buffered)

		setRunStatus(t, b.pool, "ov", a, workflow.RunStatusCancelled) // the worker honoured it
		require.Equal(t, []time.Time{c}, b.tick(t, "ov").Materialized)
		status, reason := slotDecision(t, b.pool, "ov", bSlot)
		require.Equal(t, "skipped", status)
		require.Equal(t, schedule.ReasonOverlapSuperseded, reason)
		requireOneRunPerSlotShard(t, b.pool, "ov")
	})
}

// blockingStepper runs until its context is cancelled: a slot's run "still going".
type blockingStepper struct {
	workflow.StepperDefaults[settleArgs, struct{}]
	started chan string
}

func (w *blockingStepper) Step(ctx context.Context, s *workflow.Step[settleArgs, struct{}]) (workflow.Next, error) {
	select {
	case w.started <- s.RunKey:
	default:
	}
	<-ctx.Done()
	return workflow.Next{}, context.Cause(ctx)
}

// OverlapCancelOther end to end, with real workers: the older slot's run is cancelled
// through its step's context and records why; the newer slot starts after it ended.
func TestScheduleCancelOtherCancelsRunningStep(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	engine, err := workflow.New(pool, &workflow.Config{Lease: time.Second, Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	w := &blockingStepper{started: make(chan string, 10)}
	workflow.AddWorker(engine, workers, w)
	clock := newClock(t0)
	sched, err := schedule.New(engine, &schedule.Config{Now: clock.Now})
	require.NoError(t, err)
	require.NoError(t, schedule.Add(sched, settleSchedule("cancel", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapCancelOther, 1)))
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		RetryPolicy:       fastRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	require.NoError(t, sched.Install(rc))
	rc.PeriodicJobs = nil // this test ticks by hand, with its fake clock
	client := startClient(t, pool, rc)
	ctx := context.Background()

	tick := func() *schedule.TickOutcome {
		res, err := sched.Tick(ctx, client)
		require.NoError(t, err)
		return res.Schedule("cancel")
	}
	tick()
	a, bSlot := t0.Add(time.Minute), t0.Add(2*time.Minute)
	clock.Set(a)
	require.Equal(t, []time.Time{a}, tick().Materialized)
	keyA := schedule.RunKey("cancel", a, 0)
	select {
	case k := <-w.started:
		require.Equal(t, keyA, k)
	case <-time.After(10 * time.Second):
		t.Fatal("slot A's run never started")
	}

	clock.Set(bSlot)
	st := tick()
	require.Equal(t, []string{keyA}, st.CancelRequested)
	require.Equal(t, []time.Time{bSlot}, st.Buffered)

	run := waitRun(t, pool, keyA, 15*time.Second, workflow.RunStatusCancelled, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusCancelled, run.Status)
	require.Contains(t, *run.LastError, "OverlapCancelOther")
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind = 'run.finish' AND to_state = 'cancelled'`, keyA))

	clock.Add(time.Second)
	require.Equal(t, []time.Time{bSlot}, tick().Materialized, "B starts once A has ended")
	select {
	case k := <-w.started:
		require.Equal(t, schedule.RunKey("cancel", bSlot, 0), k)
	case <-time.After(10 * time.Second):
		t.Fatal("slot B's run never started")
	}
	rep, err := operator(t, pool).SlotGet(ctx, "cancel", a)
	require.NoError(t, err)
	require.Equal(t, schedule.BatchCancelled, rep.Status)
	require.NoError(t, workflow.CancelRun(ctx, pool, schedule.RunKey("cancel", bSlot, 0), "test over"))
	waitRun(t, pool, schedule.RunKey("cancel", bSlot, 0), 15*time.Second, workflow.RunStatusCancelled)
}

// Two schedulers on separate pools tick concurrently through an hour of simulated time: no
// slot is decided twice and no (slot, shard) gets a second run.
func TestScheduleConcurrentTickers(t *testing.T) {
	t.Parallel()
	url := testkit.DBURL(t)
	clock := newClock(t0)
	var tickers []*schedBundle
	for range 2 {
		b := setupScheduler(t, mustPool(t, url), clock)
		require.NoError(t, schedule.Add(b.sched, settleSchedule("every-minute", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 2)))
		require.NoError(t, schedule.Add(b.sched, settleSchedule("every-7", "*/7 * * * *", schedule.RunLatest{}, schedule.OverlapBufferAll, 3)))
		ny := settleSchedule("hourly-ny", "0 * * * *", schedule.SkipMissed{StartingDeadline: time.Minute}, schedule.OverlapAllowAll, 1)
		ny.Zone = "America/New_York"
		require.NoError(t, schedule.Add(b.sched, ny))
		tickers = append(tickers, b)
	}
	var locked, decided int
	var mu sync.Mutex
	for step := 0; step < 180; step++ { // 20 s steps: one hour
		clock.Add(20 * time.Second)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for _, b := range tickers {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := b.sched.Tick(context.Background(), b.client)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					for _, st := range res.Schedules {
						if st.Locked {
							locked++
						}
						decided += len(st.Materialized) + len(st.Skipped) + len(st.Buffered)
					}
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	t.Logf("an hour of ticks: %d decisions, %d ticks found the schedule locked by the other", decided, locked)
	pool := tickers[0].pool
	slots, runs := requireOneRunPerSlotShard(t, pool, "every-minute")
	require.Equal(t, 60, slots)
	require.Equal(t, 120, runs)
	_, runs = requireOneRunPerSlotShard(t, pool, "every-7")
	require.Equal(t, 3, runs, "BufferAll: the first slot's runs never finish here, the rest wait")
	require.Equal(t, 9, queryInt(t, pool, `SELECT count(*) FROM stepwise_schedule_slot WHERE schedule = 'every-7'`)) // :07 ... :56, 01:00
	_, runs = requireOneRunPerSlotShard(t, pool, "hourly-ny")
	require.Equal(t, 1, runs)
	require.Equal(t, decided, queryInt(t, pool, `SELECT count(*) FROM stepwise_schedule_slot`), "each slot decided by exactly one tick")
	require.Equal(t, 3, queryInt(t, pool, `SELECT count(*) FROM stepwise_event WHERE kind = 'schedule.created'`))
}

// A DST day through the whole path: a daily 02:30 New York schedule ticked every 10 minutes
// across the spring-forward and fall-back days runs once on each, at the policy's instant.
func TestScheduleDSTDays(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		spec     string
		gap      schedule.GapPolicy
		from, to time.Time
		want     []time.Time
	}{
		{"spring forward, run after the gap", "30 2 * * *", schedule.GapRunAfter,
			time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC),
			[]time.Time{time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC)}},
		{"spring forward, skip the gap", "30 2 * * *", schedule.GapSkip,
			time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC),
			[]time.Time{time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC)}},
		{"fall back, first occurrence only", "30 1 * * *", schedule.GapRunAfter,
			time.Date(2026, 10, 31, 12, 0, 0, 0, time.UTC), time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC),
			[]time.Time{time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC), time.Date(2026, 11, 2, 6, 30, 0, 0, time.UTC)}},
		{"CRON_TZ= prefix", "CRON_TZ=Asia/Tokyo 0 9 * * *", schedule.GapRunAfter,
			time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC),
			[]time.Time{time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupScheduler(t, testkit.DB(t), newClock(tc.from))
			sch := settleSchedule("daily", tc.spec, schedule.CatchUpAll{}, schedule.OverlapAllowAll, 1)
			sch.Zone, sch.Gap = "America/New_York", tc.gap
			require.NoError(t, schedule.Add(b.sched, sch))
			var got []time.Time
			for now := tc.from; !now.After(tc.to); now = b.clock.Add(10 * time.Minute) {
				got = append(got, b.tick(t, "daily").Materialized...)
			}
			require.Equal(t, tc.want, got)
			for _, slot := range got {
				run, err := workflow.GetRun(context.Background(), b.pool, schedule.RunKey("daily", slot, 0))
				require.NoError(t, err)
				require.Equal(t, slot, run.Slot.UTC())
			}
		})
	}
}

// Changing a schedule's spec keeps the watermark, takes effect from the next slot and is
// audited with the old and new definition; pausing stops materializing without losing the
// watermark.
func TestScheduleChangeAndPause(t *testing.T) {
	t.Parallel()
	url := testkit.DBURL(t)
	clock := newClock(t0)
	ctx := context.Background()
	old := setupScheduler(t, mustPool(t, url), clock)
	require.NoError(t, schedule.Add(old.sched, settleSchedule("report", "0 * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 1)))
	old.tick(t, "report")
	clock.Set(t0.Add(time.Hour + 10*time.Minute))
	require.Equal(t, []time.Time{t0.Add(time.Hour)}, old.tick(t, "report").Materialized)

	// A deploy changes the spec to half past the hour.
	next := setupScheduler(t, mustPool(t, url), clock)
	require.NoError(t, schedule.Add(next.sched, settleSchedule("report", "30 * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 1)))
	st := next.tick(t, "report")
	require.True(t, st.Changed)
	require.Empty(t, st.Materialized, "01:30 is not due yet; nothing between the watermark and now is replayed")
	info, err := operator(t, next.pool).ScheduleGet(ctx, "report")
	require.NoError(t, err)
	require.Equal(t, "30 * * * *", info.Spec)
	require.Equal(t, 2, info.Version)
	require.Equal(t, t0.Add(time.Hour), info.Watermark, "the watermark is kept")
	var detail struct {
		Old     struct{ Spec string }
		New     struct{ Spec string }
		Version int
	}
	require.NoError(t, next.pool.QueryRow(ctx, `SELECT detail FROM stepwise_event WHERE subject = 'schedule:report' AND kind = 'schedule.changed'`).Scan(&detail))
	require.Equal(t, "0 * * * *", detail.Old.Spec)
	require.Equal(t, "30 * * * *", detail.New.Spec)
	require.Equal(t, 2, detail.Version)

	clock.Set(t0.Add(time.Hour + 31*time.Minute))
	require.Equal(t, []time.Time{t0.Add(time.Hour + 30*time.Minute)}, next.tick(t, "report").Materialized, "the new spec's next slot")

	require.NoError(t, operator(t, next.pool).SchedulePause(ctx, "report", &stepwise.SchedulePauseOpts{Actor: "ops@example", Reason: "bank holiday"}))
	clock.Set(t0.Add(3*time.Hour + 31*time.Minute))
	st = next.tick(t, "report")
	require.True(t, st.Paused)
	require.Empty(t, st.Materialized)
	info, err = operator(t, next.pool).ScheduleGet(ctx, "report")
	require.NoError(t, err)
	require.True(t, info.Paused)
	require.Equal(t, t0.Add(time.Hour+30*time.Minute), info.Watermark, "paused: the watermark stays")

	require.NoError(t, operator(t, next.pool).ScheduleResume(ctx, "report", &stepwise.SchedulePauseOpts{Actor: "ops@example", Reason: "holiday over"}))
	st = next.tick(t, "report")
	require.Equal(t, []time.Time{t0.Add(2*time.Hour + 30*time.Minute), t0.Add(3*time.Hour + 30*time.Minute)}, st.Materialized,
		"slots missed while paused go through the misfire policy (CatchUpAll here)")
	require.Equal(t, 2, queryInt(t, next.pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'schedule:report' AND kind IN ('schedule.paused', 'schedule.resumed')`))
	require.ErrorIs(t, operator(t, next.pool).SchedulePause(ctx, "nope", &stepwise.SchedulePauseOpts{Actor: "ops", Reason: "x"}), schedule.ErrNotFound)
}

// Add refuses a second schedule of the same name, naming it.
func TestScheduleDuplicateName(t *testing.T) {
	t.Parallel()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("settle", "@daily", schedule.CatchUpAll{}, schedule.OverlapBufferAll, 4)
	require.NoError(t, schedule.Add(b.sched, sch))
	err := schedule.Add(b.sched, sch)
	require.ErrorIs(t, err, schedule.ErrInvalid)
	require.Contains(t, err.Error(), `schedule "settle" is registered twice`)
}

// insertOperations writes operation rows for a run, as outbox.Enqueue would from its step.
func insertOperations(t testing.TB, pool *pgxpool.Pool, runKey string, states ...string) {
	t.Helper()
	for i, state := range states {
		extra := ""
		switch state {
		case "PROCESSING":
			extra = ", lease_until = now() + interval '1 minute'"
		case "UNKNOWN_EXTERNAL":
			extra = ", next_check_at = now()"
		}
		_, err := pool.Exec(context.Background(), `INSERT INTO stepwise_operation
			(operation_id, kind, business_key, payload, payload_hash, run_key, state)
			VALUES (gen_random_uuid(), 'payout', $1, '{}', '\x00', $2, 'PENDING')`, fmt.Sprintf("%s/%d", runKey, i), runKey)
		require.NoError(t, err)
		_, err = pool.Exec(context.Background(), `UPDATE stepwise_operation SET state = $2`+extra+` WHERE business_key = $1`,
			fmt.Sprintf("%s/%d", runKey, i), state)
		require.NoError(t, err)
	}
}

func setOperations(t testing.TB, pool *pgxpool.Pool, runKey, from, to string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE stepwise_operation SET state = $3, lease_until = NULL WHERE run_key = $1 AND state = $2`, runKey, from, to)
	require.NoError(t, err)
}

// Batch status by evidence: a slot is COMPLETED only when every shard run succeeded and
// every operation they enqueued is terminal.
func TestSlotStatusByEvidence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	require.NoError(t, schedule.Add(b.sched, settleSchedule("batch", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 2)))
	b.tick(t, "batch")
	slot := t0.Add(time.Minute)
	b.clock.Set(slot)
	b.tick(t, "batch")
	k0, k1 := schedule.RunKey("batch", slot, 0), schedule.RunKey("batch", slot, 1)
	status := func() *schedule.SlotReport {
		rep, err := operator(t, b.pool).SlotGet(ctx, "batch", slot)
		require.NoError(t, err)
		return rep
	}

	rep := status()
	require.Equal(t, schedule.BatchRunning, rep.Status)
	require.Equal(t, map[string]int{string(workflow.RunStatusPending): 2}, rep.Runs)
	require.Empty(t, rep.Operations, "no operations is not an error")

	insertOperations(t, b.pool, k0, "SUCCEEDED", "UNKNOWN_EXTERNAL", "PENDING")
	insertOperations(t, b.pool, k1, "MANUAL", "RETRYABLE")
	_, err := b.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'succeeded' WHERE key = $1`, k0)
	require.NoError(t, err)
	require.Equal(t, schedule.BatchRunning, status().Status, "shard 1 has not finished")

	_, err = b.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'succeeded' WHERE key = $1`, k1)
	require.NoError(t, err)
	rep = status()
	require.Equal(t, schedule.BatchNeedsAttention, rep.Status, "a MANUAL operation needs a person")
	require.Equal(t, 1, rep.NeedsAttention)
	require.Equal(t, map[outbox.State]int{"SUCCEEDED": 1, "UNKNOWN_EXTERNAL": 1, "PENDING": 1, "MANUAL": 1, "RETRYABLE": 1}, rep.Operations)

	setOperations(t, b.pool, k1, "MANUAL", "SUCCEEDED") // resolved by a person
	require.Equal(t, schedule.BatchReconciling, status().Status)
	setOperations(t, b.pool, k0, "UNKNOWN_EXTERNAL", "SUCCEEDED")
	setOperations(t, b.pool, k0, "PENDING", "FAILED_PERMANENT")
	setOperations(t, b.pool, k1, "RETRYABLE", "SUCCEEDED")
	rep = status()
	require.Equal(t, schedule.BatchCompleted, rep.Status)
	require.Equal(t, map[outbox.State]int{"SUCCEEDED": 4, "FAILED_PERMANENT": 1}, rep.Operations)

	// ListSlots gives the same per slot, newest first, skipped slots included.
	b.clock.Set(t0.Add(3 * time.Minute))
	b.tick(t, "batch")
	list, err := operator(t, b.pool).SlotList(ctx, "batch", &stepwise.SlotListParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, list, 3)
	require.Equal(t, t0.Add(3*time.Minute), list[0].Slot)
	require.Equal(t, schedule.BatchRunning, list[0].Status)
	require.Equal(t, schedule.BatchCompleted, list[2].Status)
	require.Equal(t, rep.Operations, list[2].Operations)

	_, err = operator(t, b.pool).SlotGet(ctx, "batch", t0.Add(time.Hour))
	require.ErrorIs(t, err, schedule.ErrSlotNotFound)
}

func TestDeriveBatchStatus(t *testing.T) {
	t.Parallel()
	type m = map[string]int
	type o = map[outbox.State]int
	tests := []struct {
		name     string
		decision string
		shards   int
		runs     m
		ops      o
		want     schedule.BatchStatus
	}{
		{"skipped", schedule.SlotSkipped, 2, nil, nil, schedule.BatchSkipped},
		{"buffered", schedule.SlotBuffered, 2, nil, nil, schedule.BatchBuffered},
		{"running", schedule.SlotMaterialized, 2, m{"running": 1, "succeeded": 1}, nil, schedule.BatchRunning},
		{"pending", schedule.SlotMaterialized, 1, m{"pending": 1}, nil, schedule.BatchRunning},
		{"done, no operations", schedule.SlotMaterialized, 2, m{"succeeded": 2}, nil, schedule.BatchCompleted},
		{"done, all terminal", schedule.SlotMaterialized, 1, m{"succeeded": 1}, o{"SUCCEEDED": 9, "FAILED_PERMANENT": 1}, schedule.BatchCompleted},
		{"unknown outcome", schedule.SlotMaterialized, 1, m{"succeeded": 1}, o{"SUCCEEDED": 9, "UNKNOWN_EXTERNAL": 1}, schedule.BatchReconciling},
		{"still sending", schedule.SlotMaterialized, 1, m{"succeeded": 1}, o{"PROCESSING": 1}, schedule.BatchReconciling},
		{"a state this version does not know", schedule.SlotMaterialized, 1, m{"succeeded": 1}, o{"ON_HOLD": 1}, schedule.BatchReconciling},
		{"manual beats reconciling", schedule.SlotMaterialized, 1, m{"succeeded": 1}, o{"MANUAL": 1, "PENDING": 3}, schedule.BatchNeedsAttention},
		{"running beats manual", schedule.SlotMaterialized, 2, m{"succeeded": 1, "running": 1}, o{"MANUAL": 1}, schedule.BatchRunning},
		{"failed run", schedule.SlotMaterialized, 2, m{"failed": 1, "running": 1}, nil, schedule.BatchFailed},
		{"missing run", schedule.SlotMaterialized, 3, m{"succeeded": 2}, nil, schedule.BatchFailed},
		{"cancelled run", schedule.SlotMaterialized, 2, m{"cancelled": 1, "succeeded": 1}, o{"SUCCEEDED": 1}, schedule.BatchCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, schedule.DeriveBatchStatus(tt.decision, tt.shards, tt.runs, tt.ops))
		})
	}
}

// The wiring a service uses: the tick as a River periodic job on a working client, with the
// database clock. A schedule that starts in the past catches up on the client's first tick.
func TestSchedulePeriodicJob(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger()})
	require.NoError(t, err)
	sched, err := schedule.New(engine, &schedule.Config{TickInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	sch := settleSchedule("periodic", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 2)
	sch.StartAt = time.Now().Add(-3 * time.Minute).Truncate(time.Minute)
	require.NoError(t, schedule.Add(sched, sch))
	rc := &river.Config{
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	rc.Workers = river.NewWorkers()
	workflow.AddWorker(engine, rc.Workers, workflow.StepFunc(func(ctx context.Context, s *workflow.Step[settleArgs, struct{}]) (workflow.Next, error) {
		return workflow.Done(), nil
	}))
	require.NoError(t, engine.Install(rc))
	require.NoError(t, sched.Install(rc))
	require.ErrorContains(t, sched.Install(rc), "one Scheduler per river.Config", "a second tick worker on the same config is refused")
	require.Contains(t, rc.Queues, river.QueueDefault, "Install adds the queue the tick job is inserted in")
	startClient(t, pool, rc) // its periodic tick job does the work
	ctx := context.Background()

	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := operator(t, pool).SlotList(ctx, "periodic", &stepwise.SlotListParams{Limit: 100})
		if !errors.Is(err, stepwisetype.ErrNotFound) { // before the first tick, the schedule has no row
			require.NoError(t, err)
		}
		completed := 0
		for _, r := range list {
			if r.Status == schedule.BatchCompleted && r.StartedAt != nil {
				completed++
			}
		}
		if completed >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, %d slots completed with a recorded start: %+v", completed, list)
		}
		time.Sleep(50 * time.Millisecond)
	}
	requireOneRunPerSlotShard(t, pool, "periodic")
	// River's default unique states include completed: with them, the first completed tick
	// would block every later one for a day. The tick job must keep coming.
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_schedule_tick' AND state = 'completed'`) >= 3
	}, 10*time.Second, 50*time.Millisecond, "the periodic tick ran at most twice")
	require.Positive(t, counterValue(t, schedule.MetricsForTest(sched).Ticks.WithLabelValues("periodic", "ok")))
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(sched.Metrics()))
	families, err := reg.Gather()
	require.NoError(t, err)
	var lagSamples uint64
	for _, f := range families {
		if f.GetName() == "stepwise_schedule_start_lag_seconds" {
			for _, m := range f.GetMetric() {
				lagSamples += m.GetHistogram().GetSampleCount()
			}
		}
	}
	require.GreaterOrEqual(t, lagSamples, uint64(3), "run start lag observed for each started slot")
}

// RunMaintenance ticks in a process whose client has no tick job (not River's leader, or a
// leader not yet elected): slots are decided all the same.
func TestScheduleRunMaintenanceTicks(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger()})
	require.NoError(t, err)
	clock := newClock(t0)
	sched, err := schedule.New(engine, &schedule.Config{TickInterval: 50 * time.Millisecond, Now: clock.Now})
	require.NoError(t, err)
	require.NoError(t, schedule.Add(sched, settleSchedule("maint", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 1)))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()}) // insert-only
	require.NoError(t, err)
	require.ErrorContains(t, sched.RunMaintenance(context.Background(), nil), "client is nil")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sched.RunMaintenance(ctx, client) }()
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM stepwise_schedule WHERE name = 'maint'`) == 1
	}, 10*time.Second, 20*time.Millisecond, "the first tick creates the row")
	clock.Set(t0.Add(2 * time.Minute))
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM stepwise_schedule_slot WHERE schedule = 'maint'`) == 2
	}, 10*time.Second, 20*time.Millisecond, "later ticks decide the due slots")
	cancel()
	require.NoError(t, <-done)
	requireOneRunPerSlotShard(t, pool, "maint")
}

// startClient starts a River client on rc and stops it when the test ends.
func startClient(t testing.TB, pool *pgxpool.Pool, rc *river.Config) *river.Client[pgx.Tx] {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	return client
}
