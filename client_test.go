package stepwise

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
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

	ioutbox "github.com/stepwise-go/stepwise/internal/outbox"
	ireconcile "github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// payArgs is a run that enqueues N payouts in its first step and ends in its second.
type payArgs struct {
	N int `json:"n"`
}

func (payArgs) Kind() string { return "client_test_pay" }

type payCursor struct {
	Enqueued bool `json:"enqueued"`
}

type payWorker struct {
	workflow.StepperDefaults[payArgs, payCursor]
}

func (payWorker) Step(ctx context.Context, s *workflow.Step[payArgs, payCursor]) (workflow.Next, error) {
	if s.Cursor.Enqueued {
		return workflow.Done(), nil
	}
	ops := make([]outbox.EnqueueParams, s.Args.N)
	for i := range ops {
		payload, _ := json.Marshal(fakebank.Payload{Account: fmt.Sprintf("ACCT-%d", i)})
		ops[i] = outbox.EnqueueParams{Kind: "payout", BusinessKey: fmt.Sprintf("%s/%d", s.RunKey, i), Payload: payload, Amount: 100, Currency: "EUR"}
	}
	if _, err := outbox.Enqueue(ctx, s.Tx, ops...); err != nil {
		return workflow.Next{}, err
	}
	s.Cursor.Enqueued = true
	return workflow.Continue(), nil
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// smallPool is a pool of maxConns connections to a fresh migrated database.
func smallPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testkit.DBURL(t))
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newBank starts a strict fake bank (it never deduplicates).
func newBank(t *testing.T, latency time.Duration) (*fakebank.Bank, *fakebank.Client) {
	t.Helper()
	bank := fakebank.New(&fakebank.Config{Strict: true, Latency: latency})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	return bank, fakebank.NewClient(bank.URL(), nil)
}

// testConfig is a client config with the pay stepper and the payout kind.
func testConfig(bc *fakebank.Client, checker bool) *Config {
	workers := river.NewWorkers()
	AddWorker(workers, payWorker{})
	kc := &KindConfig{Sender: fakebank.Sender{Client: bc}}
	if checker {
		kc.Checker = fakebank.Checker{Client: bc}
	}
	return &Config{
		River: &river.Config{
			Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
			Workers: workers,
			Logger:  quiet,
		},
		Kinds:     map[string]*KindConfig{"payout": kc},
		Workflow:  &workflow.Config{Lease: 5 * time.Second},
		Reconcile: &reconcile.Config{Interval: time.Second},
		Logger:    quiet,
	}
}

func waitRun(t *testing.T, c *Client, key string) *workflow.Run {
	t.Helper()
	var run *workflow.Run
	require.Eventually(t, func() bool {
		var err error
		run, err = workflow.GetRun(context.Background(), c.pool, key)
		require.NoError(t, err)
		return run.Status.Finished()
	}, 2*time.Minute, 20*time.Millisecond)
	return run
}

// The whole life of a client: NewClient, Start, a run whose payouts go to the bank, Stop.
// Guards against: a client that builds but does not wire a component (a stepper added with
// AddWorker that finds no engine, kinds never registered, payouts never delivered).
func TestClientEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := smallPool(t, 24)
	bank, bc := newBank(t, 0)
	c, err := NewClient(pool, testConfig(bc, true))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Start(ctx), "Start on a started client does nothing")

	run, err := c.RunStart(ctx, "client/e2e", payArgs{N: 20}, nil)
	require.NoError(t, err)
	require.True(t, run.Created)
	run = waitRun(t, c, "client/e2e")
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	require.Eventually(t, func() bool {
		ops, err := c.OperationList(ctx, &OperationListParams{RunKey: "client/e2e", State: outbox.StateSucceeded, Limit: 100})
		require.NoError(t, err)
		return len(ops) == 20
	}, time.Minute, 20*time.Millisecond)
	var succeeded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation WHERE state = 'SUCCEEDED'`).Scan(&succeeded))
	require.Equal(t, 20, succeeded)
	require.Len(t, bank.Applied(), 20)

	// One collector for the whole client; every component's metrics, and the loop's.
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c.Metrics()))
	require.Eventually(t, func() bool {
		return value(c.metrics.passes.WithLabelValues("workflow", "ok")) > 0 &&
			value(c.metrics.passes.WithLabelValues("outbox", "ok")) > 0 &&
			value(c.metrics.passes.WithLabelValues("reconcile", "ok")) > 0
	}, 30*time.Second, 50*time.Millisecond, "the maintenance loop runs each component's pass")
	families, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, prefix := range []string{"stepwise_client_maintenance_passes_total", "stepwise_outbox_", "stepwise_reconcile_", "stepwise_run"} {
		found := false
		for n := range names {
			found = found || strings.HasPrefix(n, prefix)
		}
		require.True(t, found, "no metric %s* among %v", prefix, names)
	}

	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, c.Stop(stopCtx))
	require.NoError(t, c.Stop(stopCtx), "Stop on a stopped client does nothing")
	require.ErrorContains(t, c.Start(ctx), "build a new one with NewClient", "a stopped client stays stopped")
}

// Stop drains: a send in flight when Stop is called is answered and recorded, not cut to
// UNKNOWN_EXTERNAL, and no lease is left held. Guards against: a shutdown that is River's
// hard stop (each cut send waits for the reconciler) or that leaves leases to lapse.
func TestClientStopDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := smallPool(t, 24)
	bank, bc := newBank(t, 300*time.Millisecond)
	c, err := NewClient(pool, testConfig(bc, true))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	_, err = c.RunStart(ctx, "client/drain", payArgs{N: 200}, nil)
	require.NoError(t, err)

	// Sends in flight: some payouts answered, others claimed and not yet recorded (the bank
	// takes 300 ms per payment, 16 at a time). The ledger says so for longer than the bank's
	// request log, whose entries are in flight only while the bank handles them.
	inFlight := 0
	require.Eventually(t, func() bool {
		var succeeded int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'SUCCEEDED'),
			count(*) FILTER (WHERE state = 'PROCESSING') FROM stepwise_operation`).Scan(&succeeded, &inFlight))
		return succeeded > 0 && inFlight > 0
	}, 2*time.Minute, 5*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	start := time.Now()
	require.NoError(t, c.Stop(stopCtx))
	t.Logf("drained in %s with %d payouts claimed (PROCESSING) at Stop", time.Since(start).Round(time.Millisecond), inFlight)

	var cut, midSend, held int
	require.NoError(t, pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM stepwise_event WHERE kind = 'op.transition' AND to_state = 'UNKNOWN_EXTERNAL'),
		(SELECT count(*) FROM stepwise_operation WHERE state = 'PROCESSING'),
		(SELECT count(*) FROM stepwise_checkpoint WHERE owner IS NOT NULL AND lease_until > now())`).Scan(&cut, &midSend, &held))
	require.Zero(t, cut, "sends in flight at Stop must be answered, not cut to UNKNOWN_EXTERNAL")
	require.Zero(t, midSend, "sends in flight at Stop must have their answers recorded")
	require.Zero(t, held, "every lease must be released")
	for _, r := range bank.Requests() {
		require.True(t, r.Abandoned.IsZero(), "request %d for %s was abandoned by the caller", r.Seq, r.OperationID)
	}
}

// A pool that cannot hold the config's River workers is refused, with the number and the
// fix. Guards against: pgxpool's default (max(4, NumCPU)) starving the dispatchers' recording
// and maintenance behind step transactions, silently.
func TestClientRefusesSmallPool(t *testing.T) {
	t.Parallel()
	pool := smallPool(t, 4)
	_, bc := newBank(t, 0)
	_, err := NewClient(pool, testConfig(bc, true))
	require.Error(t, err)
	t.Log(err)
	// default=2, stepwise_outbox=2, stepwise_outbox_payout=2, stepwise_reconcile=2: 8
	// workers + 2 for River + 1 for maintenance.
	require.Contains(t, err.Error(), "the pool allows 4 connections and this config needs at least 11")
	require.Contains(t, err.Error(), "pool_max_conns=")
	require.Contains(t, err.Error(), "pgxpool.Config.MaxConns")

	_, err = NewClient(nil, testConfig(bc, true))
	require.ErrorContains(t, err, "pool is nil")

	// Tight but workable: built, with a warning that names pool_max_conns.
	var logs syncBuffer
	cfg := testConfig(bc, true)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	_, err = NewClient(smallPool(t, 12), cfg)
	require.NoError(t, err)
	require.Contains(t, logs.String(), "the pool is tight")
	require.Contains(t, logs.String(), "pool_max_conns")
}

// A kind sent here with no Checker anywhere in this process is said at Start: a WARN log
// naming the kind, the gauge, and kindsWithoutChecker. Guards against: UNKNOWN_EXTERNAL
// operations of that kind waiting forever in silence.
func TestClientWarnsSenderWithoutChecker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := smallPool(t, 24)
	_, bc := newBank(t, 0)
	var logs syncBuffer
	cfg := testConfig(bc, false)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := NewClient(pool, cfg)
	require.NoError(t, err)
	require.Nil(t, c.reconciler, "no kind has a Checker: no reconciler")
	require.Equal(t, []string{"payout"}, c.kindsWithoutChecker())
	require.Equal(t, 1.0, value(c.metrics.withoutChecker.WithLabelValues("payout")))
	require.NoError(t, c.Start(ctx))
	defer c.Stop(ctx) //nolint:errcheck
	out := logs.String()
	require.Contains(t, out, "level=WARN")
	require.Contains(t, out, "has a Sender but no Checker")
	require.Contains(t, out, "kind=payout")

	// The gauge is in the client's one collector.
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c.Metrics()))
	families, err := reg.Gather()
	require.NoError(t, err)
	found := false
	for _, f := range families {
		found = found || (f.GetName() == "stepwise_client_kind_without_checker" && len(f.GetMetric()) == 1)
	}
	require.True(t, found, "stepwise_client_kind_without_checker is gathered, for the one kind")
}

// Maintenance runs in a process that is not River's leader. Guards against: takeovers,
// delivery and reconciliation waiting for the leader's periodic jobs (a dead leader is
// replaced only after River's leadership TTL).
func TestClientMaintenanceWithoutLeadership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testkit.DBURL(t)
	open := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(dbURL)
		require.NoError(t, err)
		cfg.MaxConns = 24
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	_, bc := newBank(t, 0)
	leaderCfg := testConfig(bc, true)
	leaderCfg.River.ID = "client-test-leader"
	leader, err := NewClient(open(), leaderCfg)
	require.NoError(t, err)
	require.NoError(t, leader.Start(ctx))
	defer leader.Stop(ctx) //nolint:errcheck
	pool := open()
	require.Eventually(t, func() bool {
		var id string
		err := pool.QueryRow(ctx, `SELECT leader_id FROM river_leader`).Scan(&id)
		return err == nil && id == "client-test-leader"
	}, time.Minute, 50*time.Millisecond, "the first client becomes River's leader")

	otherCfg := testConfig(bc, true)
	otherCfg.River.ID = "client-test-other"
	other, err := NewClient(pool, otherCfg)
	require.NoError(t, err)
	require.NoError(t, other.Start(ctx))
	defer other.Stop(ctx) //nolint:errcheck
	require.Eventually(t, func() bool {
		return value(other.metrics.passes.WithLabelValues("workflow", "ok")) >= 2 &&
			value(other.metrics.passes.WithLabelValues("outbox", "ok")) >= 2 &&
			value(other.metrics.passes.WithLabelValues("reconcile", "ok")) >= 1
	}, time.Minute, 50*time.Millisecond, "the non-leader runs its own maintenance passes")
	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT leader_id FROM river_leader`).Scan(&id))
	require.Equal(t, "client-test-leader", id, "the other client never led")
	require.Zero(t, value(other.metrics.passes.WithLabelValues("workflow", "error")))
}

// A stepper added with AddWorker and worked by a River client built without Stepwise fails
// with an error naming the fix, and steps nothing. Guards against: a step run with no lease,
// no fence and no failure budget.
func TestStepperOutsideClientFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := smallPool(t, 8)
	workers := river.NewWorkers()
	AddWorker(workers, payWorker{})
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}}, Workers: workers, Logger: quiet,
	})
	require.NoError(t, err)
	require.NoError(t, rc.Start(ctx))
	defer rc.StopAndCancel(ctx) //nolint:errcheck
	run, err := workflow.Start(ctx, rc, "client/outside", payArgs{N: 1}, nil)
	require.NoError(t, err)
	var errs []byte
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT coalesce(errors::text, '') FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&errs)
		return err == nil && len(errs) > 0
	}, time.Minute, 20*time.Millisecond)
	require.Contains(t, string(errs), "stepwise.NewClient")
	require.Contains(t, string(errs), "client.River()")
	require.NotContains(t, string(errs), "engine.Install", "the fix names no API a user cannot reach")
	var steps int
	require.NoError(t, pool.QueryRow(ctx, `SELECT steps FROM stepwise_checkpoint WHERE key = 'client/outside'`).Scan(&steps))
	require.Zero(t, steps)
}

// Config.WithDefaults fills every component's config and leaves the caller's River config
// as it was: NewClient installs into a copy.
func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	rc := &river.Config{Queues: map[string]river.QueueConfig{"mine": {MaxWorkers: 3}}}
	cfg := (&Config{River: rc}).WithDefaults()
	require.Equal(t, StopTimeoutDefault, cfg.StopTimeout)
	require.Equal(t, workflow.LeaseDefault, cfg.Workflow.Lease)
	require.Equal(t, ioutbox.PollIntervalDefault, cfg.Outbox.PollInterval)
	require.Equal(t, ireconcile.IntervalDefault, cfg.Reconcile.Interval)
	require.NotNil(t, cfg.Logger)
	cfg.River.Queues["other"] = river.QueueConfig{MaxWorkers: 1}
	require.Len(t, rc.Queues, 1, "WithDefaults copies the River config's queues")

	_, err := NewClient(smallPool(t, 24), &Config{River: rc, Kinds: map[string]*KindConfig{"x": {}}})
	require.ErrorContains(t, err, `Config.Kinds["x"].Sender is nil`)
}

// A bad limit is refused by NewClient with the name of the field the user set in
// stepwise.Config, not of the internal config it maps onto.
func TestNewClientNamesTheKindConfigFieldThatIsWrong(t *testing.T) {
	t.Parallel()
	pool := smallPool(t, 40)
	send := outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil })
	check := reconcile.CheckerFunc(func(context.Context, *outbox.Operation) (reconcile.LookupResult, error) {
		return reconcile.LookupResult{}, nil
	})
	for _, tc := range []struct {
		kind KindConfig
		want string
	}{
		{KindConfig{Sender: send, Checker: check, CheckBatchSize: 20000}, `Config.Kinds["k"].CheckBatchSize 20000: want 1 to 10000`},
		{KindConfig{Sender: send, Checker: check, CheckConcurrency: -1}, `Config.Kinds["k"].CheckConcurrency -1`},
		{KindConfig{Sender: send, Checker: check, CheckRatePerSecond: -1}, `Config.Kinds["k"].CheckRatePerSecond -1 is negative`},
		{KindConfig{Sender: send, Checker: check, CheckTimeout: -1}, `Config.Kinds["k"]: CheckTimeout, GiveUpAfter and MaxChecks`},
		{KindConfig{Sender: send, Checker: check, Timeout: time.Minute, Lease: 2 * time.Minute, Grace: time.Minute}, `Config.Kinds["k"].Grace 1m0s is not longer than its send Timeout 1m0s`},
		{KindConfig{Sender: send, Concurrency: -1}, `Config.Kinds["k"].Concurrency -1`},
		{KindConfig{Sender: send, Lease: time.Second, Timeout: time.Second}, `Config.Kinds["k"].Lease 1s is not longer than Timeout 1s`},
	} {
		k := tc.kind
		_, err := NewClient(pool, &Config{Logger: quiet, Kinds: map[string]*KindConfig{"k": &k}})
		require.ErrorContains(t, err, "stepwise: "+tc.want)
	}
	_, err := NewClient(pool, &Config{Logger: quiet, Kinds: map[string]*KindConfig{"k": {Sender: send}}, Outbox: &outbox.Config{PollInterval: time.Millisecond}})
	require.ErrorContains(t, err, "stepwise: Config.Outbox.PollInterval 1ms is below River's minimum period of 1s")
	// A scheduler config is checked without a schedule too: the deploy that adds the first
	// schedule is not where a wrong tick interval should be found.
	_, err = NewClient(pool, &Config{Logger: quiet, Scheduler: &schedule.Config{TickInterval: -time.Second}})
	require.ErrorContains(t, err, "stepwise: schedule.Config.TickInterval is -1s; it must be positive")
	_, err = NewClient(pool, &Config{Logger: quiet, Scheduler: &schedule.Config{MaxSlotsPerTick: -1}})
	require.ErrorContains(t, err, "stepwise: schedule.Config.MaxSlotsPerTick is -1; it must be positive")
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// value reads a counter's or a gauge's value.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// Schedules in the config give the client a scheduler, ticked by the maintenance loop in this
// process. Guards against: schedules registered and never ticked unless River's leader does.
func TestClientSchedules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, bc := newBank(t, 0)
	cfg := testConfig(bc, true)
	cfg.Schedules = []Schedule{schedule.Schedule[payArgs]{
		Name: "client-test-hourly", Spec: "@hourly", Zone: "UTC",
		Misfire: schedule.RunLatest{}, Overlap: schedule.OverlapAllowAll, Shards: 1,
		Args: func(time.Time, int) payArgs { return payArgs{N: 1} },
	}}
	cfg.Scheduler = &schedule.Config{TickInterval: 200 * time.Millisecond}
	c, err := NewClient(smallPool(t, 24), cfg)
	require.NoError(t, err)
	require.NotNil(t, c.scheduler)
	require.NoError(t, c.Start(ctx))
	defer c.Stop(ctx) //nolint:errcheck
	require.Eventually(t, func() bool {
		return value(c.metrics.passes.WithLabelValues("schedule", "ok")) >= 2
	}, time.Minute, 20*time.Millisecond, "the maintenance loop ticks the scheduler")
	var n int
	require.NoError(t, c.pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_schedule WHERE name = 'client-test-hourly'`).Scan(&n))
	require.Equal(t, 1, n, "the tick created the schedule's row")

	// A schedule refused at registration is NewClient's error.
	cfg = testConfig(bc, true)
	cfg.Schedules = []Schedule{schedule.Schedule[payArgs]{Name: "bad", Spec: "@every 1m", Zone: "UTC"}}
	_, err = NewClient(smallPool(t, 24), cfg)
	require.Error(t, err)
}

// NewClient, like river.NewClient, does not touch the database: the pool here points at a
// port nothing listens on, and every component (engine, outbox, reconciler, scheduler) is
// configured. Start is what registers the kinds, with the caller's context. Guards against:
// a write hidden behind context.Background() in a constructor that has no context, which
// hangs or fails a process whose database is slow or down at build time, where the caller
// cannot bound or cancel it.
func TestNewClientDoesNotTouchTheDatabase(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	cfg.MaxConns = 40
	var dials int
	var mu sync.Mutex
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		mu.Lock()
		dials++
		mu.Unlock()
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()

	_, bc := newBank(t, 0)
	ccfg := testConfig(bc, true)
	ccfg.Schedules = []Schedule{schedule.Schedule[payArgs]{
		Name: "nightly", Spec: "0 2 * * *", Zone: "UTC", Shards: 1,
		Misfire: schedule.RunLatest{}, Overlap: schedule.OverlapSkip,
		Args: func(time.Time, int) payArgs { return payArgs{N: 1} },
	}}
	c, err := NewClient(pool, ccfg)
	require.NoError(t, err)
	require.NotNil(t, c)
	// Nor does a client without kinds, which builds an insert-only River client for its wakes.
	_, err = NewClient(pool, &Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, dials, "NewClient reached for the database")

	// Start does, with the caller's context, and says which database step failed.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mu.Unlock()
	err = c.Start(ctx)
	mu.Lock()
	require.ErrorContains(t, err, "stepwise: Start: registering the kinds [payout]")
}
