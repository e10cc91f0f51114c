package workflow_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflow"
)

// SettleArgs identify a run and carry its input: River job args, as River users write them.
type SettleArgs struct {
	Date string `json:"date"`
}

func (SettleArgs) Kind() string { return "example_settle" }

// SettleCursor is what survives a crash: where the next step starts.
type SettleCursor struct {
	AfterMerchant int64 `json:"after_merchant"`
}

type SettleWorker struct {
	workflow.StepperDefaults[SettleArgs, SettleCursor]
}

// Step settles the next 100 merchants in one set-based statement. Its writes, the new
// cursor and (in a real service) its outbox rows commit together, fenced by the run's token.
func (w *SettleWorker) Step(ctx context.Context, s *workflow.Step[SettleArgs, SettleCursor]) (workflow.Next, error) {
	var last *int64
	err := s.Tx.QueryRow(ctx, `
		WITH batch AS (
			SELECT id FROM merchant WHERE id > $2 ORDER BY id LIMIT 100
		), settled AS (
			INSERT INTO settlement (merchant_id, settle_date)
			SELECT id, $1::date FROM batch
			ON CONFLICT DO NOTHING
		)
		SELECT max(id) FROM batch`, s.Args.Date, s.Cursor.AfterMerchant).Scan(&last)
	if err != nil {
		return workflow.Next{}, err // rolled back; retried from the last committed cursor
	}
	if last == nil {
		return workflow.Done(), nil
	}
	s.Cursor.AfterMerchant = *last
	return workflow.Continue(), nil
}

func Example() {
	ctx := context.Background()
	pool, cleanup := testkit.ExampleDB(ctx) // a migrated database (migrations.Migrate)
	defer cleanup()
	_, err := pool.Exec(ctx, `
		CREATE TABLE merchant (id bigint PRIMARY KEY);
		INSERT INTO merchant SELECT generate_series(1, 250);
		CREATE TABLE settlement (merchant_id bigint, settle_date date, PRIMARY KEY (merchant_id, settle_date));`)
	if err != nil {
		log.Fatal(err)
	}

	// Wiring, the same for every Stepwise component: New, Install on your river.Config,
	// river.NewClient, RunMaintenance in every process, Metrics registered. Stepwise's
	// workers go beside your own River workers, in your own client.
	engine, err := workflow.New(pool, &workflow.Config{Lease: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	riverConfig := &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: river.NewWorkers(),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if err := workflow.AddWorkerSafely(engine, riverConfig.Workers, &SettleWorker{}); err != nil {
		log.Fatal(err)
	}
	// The maintenance worker, periodic job and queue; Slice checked against River's rescue.
	if err := engine.Install(riverConfig); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), riverConfig)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx) //nolint:errcheck
	maintCtx, stopMaintenance := context.WithCancel(ctx)
	defer stopMaintenance()
	// Fast takeover of runs whose worker died, without waiting for River's leader.
	go engine.RunMaintenance(maintCtx, client) //nolint:errcheck

	prometheus.NewRegistry().MustRegister(engine.Metrics()) // your registry

	// One run per key, forever: starting it again (a second cron fire, a retried request)
	// returns the same run.
	run, err := workflow.Start(ctx, client, "settle/2026-11-29", SettleArgs{Date: "2026-11-29"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	again, _ := workflow.Start(ctx, client, "settle/2026-11-29", SettleArgs{Date: "2026-11-29"}, nil)
	fmt.Println("created:", run.Created, "then:", again.Created)

	for run.Status != workflow.StatusSucceeded && run.Status != workflow.StatusFailed {
		time.Sleep(20 * time.Millisecond)
		if run, err = workflow.GetRun(ctx, pool, run.Key); err != nil {
			log.Fatal(err)
		}
	}
	var settled int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM settlement").Scan(&settled)
	cp, _ := engine.Checkpoints().Get(ctx, run.Key)
	fmt.Printf("run %s: %d merchants settled in %d steps, cursor %s\n", run.Status, settled, cp.Steps, cp.Cursor)

	// Output:
	// created: true then: false
	// run succeeded: 250 merchants settled in 4 steps, cursor {"after_merchant": 250}
}
