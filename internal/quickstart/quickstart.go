// Package quickstart is the README's quick start, compiled: the code between the README
// markers below is the README's Go block, character for character (docs/readme_test.go
// compares them), and helpers.go gives it the two business functions the README leaves to
// the reader. The drain test runs it in a real process and sends it SIGTERM.
package quickstart

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
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
	// One payout per merchant (outbox.EnqueueParams), in the same transaction; operation_id
	// = UUID v5 of kind + business key, stable forever.
	if _, err := outbox.Enqueue(ctx, s.Tx, payouts(s.Args.Date, ids)...); err != nil {
		return workflow.Next{}, err
	}
	s.Cursor.AfterMerchant = ids[len(ids)-1]
	return workflow.Continue(), nil // fenced commit of writes + cursor + outbox rows
}

// Bank is your adapter to the external system: it pays under the operation_id and looks a
// payment up by it (workflowtest/fakebank's Sender and Checker show the pattern). Over HTTP,
// send through outbox/httpsend: net/http alone resends a POST carrying an Idempotency-Key by
// itself, and its "connection refused" can follow a payment the bank made.
type Bank interface {
	outbox.Sender
	reconcile.Checker
}

// run wires Stepwise beside your own River workers, in your own River client, settles a
// date, and drains when ctx ends (main makes ctx with signal.NotifyContext for SIGTERM).
func run(ctx context.Context, pool *pgxpool.Pool, bank Bank) error {
	if err := migrations.Migrate(ctx, pool); err != nil { // River's schema, then Stepwise's
		return err
	}
	engine, err := workflow.New(pool, &workflow.Config{})
	if err != nil {
		return err
	}
	ob, err := outbox.New(pool, &outbox.Config{Kinds: map[string]*outbox.KindConfig{
		"payout": {Sender: bank}, // an error it cannot classify makes the payout UNKNOWN_EXTERNAL
	}})
	if err != nil {
		return err
	}
	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: ob, Kinds: map[string]*reconcile.KindConfig{
		"payout": {Checker: bank}, // settles UNKNOWN_EXTERNAL payouts by asking about their id
	}})
	if err != nil {
		return err
	}
	rc := &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: river.NewWorkers(),
	}
	if err := workflow.AddWorkerSafely(engine, rc.Workers, &SettleWorker{}); err != nil {
		return err
	}
	// Workers, periodic jobs and queues of each; the engine checks Slice against
	// rc.RescueStuckJobsAfter.
	for _, install := range []func(*river.Config) error{engine.Install, ob.Install, rec.Install} {
		if err := install(rc); err != nil {
			return err
		}
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return err
	}
	// Not ctx: cancelling Start's context is River's hard stop, which cuts the steps and
	// the bank calls in flight (each cut call becomes UNKNOWN_EXTERNAL). SIGTERM drains,
	// below.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	// In every process: a dead River leader must delay neither takeover, delivery nor
	// reconciliation.
	go engine.RunMaintenance(ctx, client)
	go ob.RunMaintenance(ctx, client)
	go rec.RunMaintenance(ctx, client)
	prometheus.MustRegister(engine.Metrics(), ob.Metrics(), rec.Metrics())
	// Starting the same key again (a second cron fire, a retried request) is the same run.
	_, err = workflow.Start(ctx, client, "settle/2026-11-29", SettleArgs{Date: "2026-11-29"}, nil)
	if err != nil && ctx.Err() == nil {
		return err
	} // (SIGTERM while starting: River is started, so drain as below)

	// SIGTERM: drain. The step and the sends in flight finish; none begins.
	<-ctx.Done()
	engine.Quiesce() // the step in flight commits and releases its run's lease
	ob.Quiesce()     // the sends in flight get their answers recorded
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil { // past the deadline: cut, the reconciler settles
		return client.StopAndCancel(context.Background())
	}
	return nil
}

// README END
