// Package quickstart is the README's quick start, compiled: the code between the README
// markers below is the README's Go block, character for character (docs/readme_test.go
// compares them), and helpers.go gives it the business functions and the bank adapter the
// README leaves to the reader. The drain test runs it in a real process and sends it SIGTERM.
package quickstart

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/workflow"
)

// README BEGIN
type SettleArgs struct { // River job args: identify the run and carry its input
	Date  string `json:"date"`
	Shard int    `json:"shard"`
}

func (SettleArgs) Kind() string { return "settle" }

type SettleCursor struct {
	AfterMerchant int64 `json:"after_merchant"`
}

type SettleWorker struct {
	workflow.StepperDefaults[SettleArgs, SettleCursor]
}

func (w *SettleWorker) Step(ctx context.Context, s *workflow.Step[SettleArgs, SettleCursor]) (workflow.Next, error) {
	ids, err := settleBatch(ctx, s.Tx, s.Args.Date, s.Cursor.AfterMerchant, 500) // one set-based statement
	if err != nil {
		return workflow.Next{}, err // rolled back; retried from the last committed cursor
	}
	if len(ids) == 0 {
		return workflow.Done(), nil
	}
	// One payout per merchant, in the same transaction; operation_id = UUID v5 of kind +
	// business key, stable forever.
	if _, err := outbox.Enqueue(ctx, s.Tx, payouts(s.Args.Date, ids)...); err != nil {
		return workflow.Next{}, err
	}
	s.Cursor.AfterMerchant = ids[len(ids)-1]
	return workflow.Continue(), nil // fenced commit of writes + cursor + outbox rows
}

// run wires Stepwise into one client beside your own River workers and queues, settles a
// date, and drains when ctx ends (main makes ctx with signal.NotifyContext for SIGTERM).
func run(ctx context.Context, pool *pgxpool.Pool, bank Bank) error {
	if err := migrations.Migrate(ctx, pool); err != nil { // River's schema, then Stepwise's
		return err
	}
	workers := river.NewWorkers() // your own River workers go here too
	stepwise.AddWorker(workers, &SettleWorker{})
	client, err := stepwise.NewClient(pool, &stepwise.Config{
		River: &river.Config{
			Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
			Workers: workers,
		},
		Kinds: map[string]*stepwise.KindConfig{
			// Sender pays under the operation_id (an error it cannot classify makes the payout
			// UNKNOWN_EXTERNAL); Checker settles those by asking the bank about their id.
			"payout": {Sender: bank, Checker: bank},
		},
	})
	if err != nil {
		return err // e.g. a pool too small for the queues: the error names pool_max_conns
	}
	// River, and the maintenance loop of this process (takeovers, delivery, reconciliation
	// never wait for River's leader). ctx ending does not cut anything: Stop drains, below.
	if err := client.Start(ctx); err != nil {
		return err
	}
	prometheus.MustRegister(client.Metrics())
	// Starting the same key again (a second cron fire, a retried request) is the same run.
	_, err = client.RunStart(ctx, "settle/2026-11-29", SettleArgs{Date: "2026-11-29"}, nil)
	if err != nil && ctx.Err() == nil {
		return errors.Join(err, client.Stop(context.Background()))
	}
	<-ctx.Done()
	// SIGTERM: drain. The step in flight commits and releases its lease, the sends in flight
	// get their answers recorded, none begins; past Config.StopTimeout (30s) they are cut
	// and the reconciler settles the cut sends.
	return client.Stop(context.Background())
}

// README END
