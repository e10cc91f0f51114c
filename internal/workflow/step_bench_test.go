package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// BenchmarkStepOverhead measures what the step protocol (claim, stall timeout, token check,
// fenced cursor write, run bookkeeping, River job) costs over the same business writes made by
// hand in plain pgx: BEGIN, the writes, a fenced cursor UPDATE, COMMIT. Both run in the same
// benchmark, on the same database, interleaved. The stepwise/floor metric is the ratio of
// their throughputs (1.00: the protocol costs nothing); docs/design.md's budget is >= 0.90 for one
// row per step and >= 0.95 for 100. ns/op is per step, of both variants together. Each
// Stepwise chunk is one run, so its claim, River pickup and completion are counted once per
// b.N/8 steps. The outbox variants also enqueue one operation per row in both (the floor
// outside a River worker, so without a dispatcher wake): a step that enqueues must cost what
// its own statements cost, the wake included.
//
//	go test ./workflow -run '^$' -bench StepOverhead -benchtime 2000x
//
// The sample's own bench (stepwise-lab bench) measures the same against the real
// settlement statement and its outbox rows.
func BenchmarkStepOverhead(b *testing.B) {
	for _, v := range []struct {
		rows int
		ops  bool
	}{{1, false}, {100, false}, {1, true}, {100, true}} {
		name := fmt.Sprintf("rows=%d", v.rows)
		if v.ops {
			name += "/outbox"
		}
		b.Run(name, func(b *testing.B) {
			rows := v.rows
			pool := ovhDB(b)
			rig := newOvhRig(b, pool, rows, v.ops, 2, nil)

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

// BenchmarkStepOverheadConcurrent runs 8 Stepwise runs at once in one process against 8
// hand-written loops at once, each step writing 100 rows and enqueueing 100 operations of one
// kind. Concurrent runs must not queue on anything they share (they once queued on the
// dispatcher wake's row). stepwise/floor is the ratio of the throughputs (target >= 0.90).
//
//	go test ./workflow -run '^$' -bench StepOverheadConcurrent -benchtime 1600x
func BenchmarkStepOverheadConcurrent(b *testing.B) {
	const runs, rows = 8, 100
	pool := ovhDB(b)
	rig := newOvhRig(b, pool, rows, true, runs, nil)
	steps := max(b.N/(4*runs), 1) // per run, per chunk: 4 chunks, ABBA
	var floor, stepwise time.Duration
	b.ResetTimer()
	for i := range 4 {
		start := time.Now()
		var wg sync.WaitGroup
		for r := range runs {
			key := fmt.Sprintf("ovhc/%d/%d", i, r)
			if i == 0 || i == 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rig.floor(b, key, steps)
				}()
			} else {
				_, err := workflow.Start(context.Background(), rig.client, key, ovhArgs{Steps: steps, Rows: rows, Ops: true}, nil)
				require.NoError(b, err)
			}
		}
		if i == 0 || i == 3 {
			wg.Wait()
			floor += time.Since(start)
			continue
		}
		var end time.Time
		for range runs {
			select {
			case end = <-rig.done:
			case <-time.After(5 * time.Minute):
				b.Fatalf("the concurrent runs of chunk %d did not finish", i)
			}
		}
		stepwise += end.Sub(start)
	}
	b.StopTimer()
	b.ReportMetric(floor.Seconds()/stepwise.Seconds(), "stepwise/floor")
	b.ReportMetric(float64(2*runs*steps)/stepwise.Seconds(), "steps/s")
	b.ReportMetric(float64(2*runs*steps)/floor.Seconds(), "floor_steps/s")
}

// ovhDB is a fresh database with the benchmark's tables.
func ovhDB(b *testing.B) *pgxpool.Pool {
	b.Helper()
	pool := testkit.DB(b)
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE ovh_item (run_key text NOT NULL, n int NOT NULL, amount bigint NOT NULL, PRIMARY KEY (run_key, n));
		CREATE TABLE ovh_cursor (key text PRIMARY KEY, token bigint NOT NULL, cursor bigint NOT NULL)`)
	require.NoError(b, err)
	return pool
}

type ovhArgs struct {
	Steps int  `json:"steps"`
	Rows  int  `json:"rows"`
	Ops   bool `json:"ops"`
}

func (ovhArgs) Kind() string { return "bench_step_overhead" }

type ovhCursor struct {
	Step int `json:"step"`
}

// ovhStep writes one step's rows, and with ops one outbox operation per row: the business
// write both variants share.
func ovhStep(ctx context.Context, tx pgx.Tx, key string, step, rows int, ops bool) error {
	_, err := tx.Exec(ctx, `INSERT INTO ovh_item (run_key, n, amount)
		SELECT $1, g, g * 7 FROM generate_series($2::int, $3::int - 1) g`, key, step*rows, (step+1)*rows)
	if err != nil || !ops {
		return err
	}
	batch := make([]outbox.EnqueueParams, rows)
	for i := range batch {
		n := step*rows + i
		batch[i] = outbox.EnqueueParams{Kind: "bench_payout", BusinessKey: fmt.Sprintf("%s/%d", key, n),
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, n)), Amount: int64(n * 7), Currency: "EUR", RunKey: key}
	}
	_, err = outbox.Enqueue(ctx, tx, batch...)
	return err
}

type ovhRig struct {
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
	rows   int
	ops    bool
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

// newOvhRig starts a River client working the benchmark's runs with workers at once. With
// ops, steps enqueue outbox operations (inside the River worker: with the dispatcher wake;
// the dispatcher's queue is not worked here, delivery is not what is measured).
// tp is the engine's TracerProvider (nil: otel's global one, a no-op in these benchmarks).
func newOvhRig(b *testing.B, pool *pgxpool.Pool, rows int, ops bool, workers int, tp trace.TracerProvider) *ovhRig {
	b.Helper()
	rig := &ovhRig{pool: pool, rows: rows, ops: ops, done: make(chan time.Time, workers)}
	engine, err := workflow.New(pool, &workflow.Config{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	require.NoError(b, err)
	ws := river.NewWorkers()
	workflow.AddWorker(engine, ws, workflow.StepFunc(func(ctx context.Context, s *workflow.Step[ovhArgs, ovhCursor]) (workflow.Next, error) {
		if err := ovhStep(ctx, s.Tx, s.RunKey, s.Cursor.Step, s.Args.Rows, s.Args.Ops); err != nil {
			return workflow.Next{}, err
		}
		s.ReportItems(s.Args.Rows)
		s.Cursor.Step++
		if s.Cursor.Step >= s.Args.Steps {
			return workflow.Done(), nil
		}
		return workflow.Continue(), nil
	}))
	rc := &river.Config{
		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:    ws,
		Middleware: []rivertype.Middleware{&ovhDone{done: rig.done}},
		Logger:     slog.New(slog.DiscardHandler),
	}
	require.NoError(b, engine.Install(rc))
	if ops {
		// The client must know the dispatcher's job kind to queue it and carry the waker's
		// middleware; its queue is left out.
		ob, err := outbox.New(pool, &outbox.Config{Logger: slog.New(slog.DiscardHandler), Kinds: map[string]*outbox.KindConfig{
			"bench_payout": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
				return outbox.Receipt{}, outbox.NotSent(errors.New("the benchmark delivers nothing"))
			})},
		}})
		require.NoError(b, err)
		require.NoError(b, ob.InstallWithoutDelivery(rc)) // its worker and the waker's middleware, no queue
		require.NoError(b, ob.Register(context.Background()))
	}
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
			if err := ovhStep(ctx, tx, key, step, r.rows, r.ops); err != nil {
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
	_, err := workflow.Start(ctx, r.client, key, ovhArgs{Steps: steps, Rows: r.rows, Ops: r.ops}, nil)
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
