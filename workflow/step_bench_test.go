package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflow"
)

// BenchmarkStepOverhead measures what the step protocol (claim, stall timeout, token check,
// fenced cursor write, run bookkeeping, River job) costs over the same business writes made by
// hand in plain pgx: BEGIN, the writes, a fenced cursor UPDATE, COMMIT. Both run in the same
// benchmark, on the same database, interleaved. The stepwise/floor metric is the ratio of
// their throughputs (1.00: the protocol costs nothing); docs/design.md's budget is >= 0.90 for
// steps of a realistic size. ns/op is per step, of both variants together. Each Stepwise chunk
// is one run, so its claim, River pickup and completion are counted once per b.N/8 steps.
//
//	go test ./workflow -run '^$' -bench StepOverhead -benchtime 2000x
//
// The sample's own bench (sample-settlement bench) measures the same against the real
// settlement statement and its outbox rows.
func BenchmarkStepOverhead(b *testing.B) {
	for _, rows := range []int{1, 100} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			ctx := context.Background()
			pool := testkit.DB(b)
			_, err := pool.Exec(ctx, `
				CREATE TABLE ovh_item (run_key text NOT NULL, n int NOT NULL, amount bigint NOT NULL, PRIMARY KEY (run_key, n));
				CREATE TABLE ovh_cursor (key text PRIMARY KEY, token bigint NOT NULL, cursor bigint NOT NULL)`)
			require.NoError(b, err)
			rig := newOvhRig(b, pool, rows)

			// Eight chunks, ABBA ABBA: load that drifts during the benchmark (this machine is
			// shared) lands on both variants alike.
			chunk := max(b.N/8, 1)
			var floor, stepwise time.Duration
			b.ResetTimer()
			for i := range 8 {
				key := fmt.Sprintf("ovh/%d", i)
				if i%4 == 0 || i%4 == 3 {
					floor += rig.floor(b, key, chunk)
				} else {
					stepwise += rig.stepwise(b, key, chunk)
				}
			}
			b.StopTimer()
			b.ReportMetric(floor.Seconds()/stepwise.Seconds(), "stepwise/floor")
			b.ReportMetric(float64(4*chunk)/stepwise.Seconds(), "steps/s")
			b.ReportMetric(float64(4*chunk)/floor.Seconds(), "floor_steps/s")
		})
	}
}

type ovhArgs struct {
	Steps int `json:"steps"`
	Rows  int `json:"rows"`
}

func (ovhArgs) Kind() string { return "bench_step_overhead" }

type ovhCursor struct {
	Step int `json:"step"`
}

// ovhStep writes one step's rows: the business write both variants share.
func ovhStep(ctx context.Context, tx pgx.Tx, key string, step, rows int) error {
	_, err := tx.Exec(ctx, `INSERT INTO ovh_item (run_key, n, amount)
		SELECT $1, g, g * 7 FROM generate_series($2::int, $3::int - 1) g`, key, step*rows, (step+1)*rows)
	return err
}

type ovhRig struct {
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
	rows   int
	done   chan time.Time
}

// ovhDone is River middleware that reports when the Work of a benchmark run returns: after
// its last step's commit, which also completed the River job.
type ovhDone struct {
	river.MiddlewareDefaults
	done chan time.Time
}

func (m *ovhDone) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	err := doInner(ctx)
	if job.Kind == (ovhArgs{}).Kind() && err == nil {
		m.done <- time.Now()
	}
	return err
}

func newOvhRig(b *testing.B, pool *pgxpool.Pool, rows int) *ovhRig {
	b.Helper()
	rig := &ovhRig{pool: pool, rows: rows, done: make(chan time.Time, 1)}
	engine, err := workflow.New(pool, &workflow.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, workflow.StepFunc(func(ctx context.Context, s *workflow.Step[ovhArgs, ovhCursor]) (workflow.Next, error) {
		if err := ovhStep(ctx, s.Tx, s.RunKey, s.Cursor.Step, s.Args.Rows); err != nil {
			return workflow.Next{}, err
		}
		s.Cursor.Step++
		if s.Cursor.Step >= s.Args.Steps {
			return workflow.Done(), nil
		}
		return workflow.Continue(), nil
	}))
	rc := &river.Config{
		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers:    workers,
		Middleware: []rivertype.Middleware{&ovhDone{done: rig.done}},
		Logger:     slog.New(slog.DiscardHandler),
	}
	require.NoError(b, engine.Install(rc))
	rig.client, err = river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(b, rig.client.Start(ctx))
	b.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = rig.client.Stop(stopCtx)
		cancel()
	})
	return rig
}

// floor runs steps by hand: one claim, then per step BEGIN, the writes, a fenced cursor
// UPDATE, COMMIT.
func (r *ovhRig) floor(b *testing.B, key string, steps int) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	var token int64
	require.NoError(b, r.pool.QueryRow(ctx, `INSERT INTO ovh_cursor (key, token, cursor) VALUES ($1, 1, 0)
		ON CONFLICT (key) DO UPDATE SET token = ovh_cursor.token + 1 RETURNING token`, key).Scan(&token))
	for step := range steps {
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if err := ovhStep(ctx, tx, key, step, r.rows); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `UPDATE ovh_cursor SET cursor = $3 WHERE key = $1 AND token = $2`, key, token, step+1)
			if err == nil && tag.RowsAffected() != 1 {
				err = errors.New("fenced")
			}
			return err
		})
		require.NoError(b, err)
	}
	return time.Since(start)
}

// stepwise runs the same steps as one Stepwise run, timed from workflow.Start to the return
// of the Work that committed the last step.
func (r *ovhRig) stepwise(b *testing.B, key string, steps int) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	_, err := workflow.Start(ctx, r.client, key, ovhArgs{Steps: steps, Rows: r.rows}, nil)
	require.NoError(b, err)
	select {
	case end := <-r.done:
		return end.Sub(start)
	case <-time.After(5*time.Minute + time.Duration(steps)*10*time.Millisecond):
		run, err := workflow.GetRun(ctx, r.pool, key)
		require.NoError(b, err)
		b.Fatalf("run %s did not finish: %s (%s)", key, run.Status, deref(run.LastError))
		return 0
	}
}
