package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// Backlog of the maintenance section: a queue that has fallen behind, where a pass must
// still be quick for crashed runs to be taken over on time.
const (
	maintPending = 100_000
	maintRunning = 1_000
	maintPasses  = 200
)

// maintenanceSection times one pass of the workflow engine's maintenance (the takeover scan
// of vanished workers, the page of River's running jobs, the sweep for runs whose job ended,
// the cancel scan) with 100,000 pending runs and 1,000 running ones holding live leases. Every
// process that runs Engine.RunMaintenance pays this once a second, so it must not grow with
// the backlog. Target: the median pass <= 5 ms. It then prints the plan of every statement
// of one pass (auto_explain through the pass's own connection), to show they are index-driven.
func (r *runner) maintenanceSection(ctx context.Context) error {
	pool, dbURL, err := r.sectionDB(ctx, "maintenance")
	if err != nil {
		return err
	}
	defer pool.Close()
	_, bank, stop, err := startBank()
	if err != nil {
		return err
	}
	defer stop()
	svc, err := sampleService(pool, bank)
	if err != nil {
		return err
	}
	began := time.Now()
	if err := seedRuns(ctx, pool, "pending/", maintPending, false); err != nil {
		return err
	}
	if err := seedRuns(ctx, pool, "running/", maintRunning, true); err != nil {
		return err
	}
	for _, table := range []string{"stepwise_checkpoint", "stepwise_run", "river_job"} {
		if _, err := pool.Exec(ctx, "ANALYZE "+table); err != nil {
			return err
		}
	}
	r.progress("maintenance: seeded %d pending and %d running runs in %s", maintPending, maintRunning, time.Since(began).Round(time.Millisecond))

	// One pass first: it must not take over a run whose lease is live.
	res, err := svc.Engine.Maintain(ctx, svc.Client.River())
	if err != nil {
		return fmt.Errorf("maintenance pass: %w", err)
	}
	if n := len(res.TakenOver); n > 0 {
		return fmt.Errorf("maintenance took over %d runs whose leases are live", n)
	}
	passes := make([]time.Duration, 0, maintPasses)
	for range maintPasses {
		t := time.Now()
		if _, err := svc.Engine.Maintain(ctx, svc.Client.River()); err != nil {
			return fmt.Errorf("maintenance pass: %w", err)
		}
		passes = append(passes, time.Since(t))
	}
	slices.Sort(passes)
	median, p95 := passes[len(passes)/2], passes[len(passes)*95/100]

	r.printf("\n== maintenance: one pass of Engine.Maintain with %d pending and %d running runs (live leases) ==\n", maintPending, maintRunning)
	r.printf("median %s, p95 %s, max %s over %d passes (each process running Engine.RunMaintenance pays one a second)\n",
		fmtDur(median), fmtDur(p95), fmtDur(passes[len(passes)-1]), maintPasses)
	r.check(median <= 5*time.Millisecond, "maintenance pass <= 5ms with %dk pending and %dk running runs: median %s", maintPending/1000, maintRunning/1000, fmtDur(median))

	plans, err := maintenancePlans(ctx, dbURL, svc)
	if err != nil {
		r.printf("(plans not shown: %v)\n", err)
		return nil
	}
	r.printf("plans of one pass's statements (auto_explain, ANALYZE):\n%s", plans)
	return nil
}

// seedRuns inserts n runs under prefix straight into the tables, as n Start calls and (when
// running) n claims would leave them: a checkpoint, a River job and a run row each.
func seedRuns(ctx context.Context, pool *pgxpool.Pool, prefix string, n int, running bool) error {
	state := "available"
	if running {
		state = "running"
	}
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key, owner, lease_until, fencing_token)
		SELECT $1 || g, CASE WHEN $3 THEN 'bench' END, CASE WHEN $3 THEN now() + interval '1 hour' END, CASE WHEN $3 THEN 1 ELSE 0 END
		  FROM generate_series(1, $2::int) g`, prefix, n, running)
	if err != nil {
		return fmt.Errorf("seeding checkpoints: %w", err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, priority, metadata, attempt, attempted_at)
		SELECT jsonb_build_object('date', '2001-01-01', 'shard', g), $5, 25, 'bench_maintenance', $3::river_job_state, 1,
		       jsonb_build_object('stepwise_run', $1 || g), CASE WHEN $4 THEN 1 ELSE 0 END,
		       CASE WHEN $4 THEN now() - interval '1 hour' END
		  FROM generate_series(1, $2::int) g`, prefix, n, state, running, settlement.SettleArgs{}.Kind())
	if err != nil {
		return fmt.Errorf("seeding River jobs: %w", err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, river_job_id, status)
		SELECT metadata->>'stepwise_run', kind, args, id, CASE WHEN $2 THEN 'running' ELSE 'pending' END
		  FROM river_job WHERE metadata->>'stepwise_run' LIKE $1 || '%'`, prefix, running)
	if err != nil {
		return fmt.Errorf("seeding runs: %w", err)
	}
	return nil
}

// maintenancePlans runs one pass on a pool whose connections log every statement's plan to
// the client (auto_explain at client_min_messages = log) and returns those plans. It needs
// a superuser to LOAD auto_explain; elsewhere it says why it cannot.
func maintenancePlans(ctx context.Context, dbURL string, svc *sample) (string, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return "", err
	}
	var (
		mu    sync.Mutex
		plans []string
	)
	cfg.MaxConns = 1
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "Query Text:") {
			mu.Lock()
			plans = append(plans, n.Message)
			mu.Unlock()
		}
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain'`)
		if err != nil {
			return fmt.Errorf("LOAD 'auto_explain' (needs a superuser): %w", err)
		}
		_, err = c.Exec(ctx, `SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
			SET auto_explain.log_buffers = on; SET auto_explain.log_timing = on; SET client_min_messages = log`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return "", err
	}
	// An engine of the service's config on the explaining connection: a whole service (its
	// client) would refuse a one-connection pool, and only the engine's pass is explained.
	ecfg := svc.Engine.Config()
	ecfg.Logger = quietLogger()
	explainer, err := workflow.New(pool, &ecfg)
	if err != nil {
		return "", err
	}
	mu.Lock()
	plans = nil
	mu.Unlock()
	if _, err := explainer.Maintain(ctx, svc.Client.River()); err != nil {
		return "", err
	}
	mu.Lock()
	defer mu.Unlock()
	var b strings.Builder
	for _, p := range plans {
		for _, line := range strings.Split(strings.TrimSpace(p), "\n") {
			fmt.Fprintf(&b, "    %s\n", line)
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}
