package workflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// PayoutKind is the kind of operation a settle step enqueues: one payout per merchant.
const PayoutKind = "example_payout"

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

// Step settles the next 100 merchants in one set-based statement and enqueues one payout
// per merchant in the ledger. The settlement rows, the payouts and the new cursor commit
// together, fenced by the run's token: a crash loses none of them and doubles none.
func (w *SettleWorker) Step(ctx context.Context, s *workflow.Step[SettleArgs, SettleCursor]) (workflow.Next, error) {
	rows, err := s.Tx.Query(ctx, `
		WITH batch AS (
			SELECT id FROM merchant WHERE id > $2 ORDER BY id LIMIT 100
		), settled AS (
			INSERT INTO settlement (merchant_id, settle_date)
			SELECT id, $1::date FROM batch
			ON CONFLICT DO NOTHING
		)
		SELECT id FROM batch ORDER BY id`, s.Args.Date, s.Cursor.AfterMerchant)
	if err != nil {
		return workflow.Next{}, err // rolled back; retried from the last committed cursor
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return workflow.Next{}, err
	}
	s.ReportItems(len(ids)) // on the step's trace span, when tracing is on
	if len(ids) == 0 {
		return workflow.Done(), nil
	}
	payouts := make([]outbox.EnqueueParams, len(ids))
	for i, id := range ids {
		payload, _ := json.Marshal(fakebank.Payload{Account: fmt.Sprintf("ACCT-%d", id)})
		payouts[i] = outbox.EnqueueParams{
			Kind:        PayoutKind,
			BusinessKey: fmt.Sprintf("%s/%d", s.Args.Date, id), // operation_id: stable forever
			Payload:     payload,
			Amount:      100, Currency: "EUR",
		}
	}
	if _, err := outbox.Enqueue(ctx, s.Tx, payouts...); err != nil { // same transaction
		return workflow.Next{}, err
	}
	s.Cursor.AfterMerchant = ids[len(ids)-1]
	return workflow.Continue(), nil
}

func Example() {
	ctx := context.Background()
	pool, cleanup := testkit.ExampleDB(ctx) // a database prepared by migrations.Migrate(ctx, pool)
	defer cleanup()
	_, err := pool.Exec(ctx, `
		CREATE TABLE merchant (id bigint PRIMARY KEY);
		INSERT INTO merchant SELECT generate_series(1, 250);
		CREATE TABLE settlement (merchant_id bigint, settle_date date, PRIMARY KEY (merchant_id, settle_date));`)
	if err != nil {
		log.Fatal(err)
	}

	// The external system: here Stepwise's fake bank, strict (it never deduplicates), whose
	// answer to one payout is lost after it paid — the ledger cannot know whether that one
	// paid, so it becomes UNKNOWN_EXTERNAL and the reconciler asks the bank about its id.
	bank := fakebank.New(&fakebank.Config{Strict: true})
	if err := bank.Start(); err != nil {
		log.Fatal(err)
	}
	defer bank.Close() //nolint:errcheck
	bank.FailKey(outbox.OperationID(PayoutKind, "2026-11-29/7").String(), fakebank.Error5xxAfterApply)
	bankClient := fakebank.NewClient(bank.URL(), nil)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Wiring: one Stepwise client, beside your own River workers and queues, in one River
	// client. Size the pool for the queues (NewClient refuses a pool that cannot work them).
	workers := river.NewWorkers()
	stepwise.AddWorker(workers, &SettleWorker{})
	client, err := stepwise.NewClient(pool, &stepwise.Config{
		River: &river.Config{
			Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
			Workers: workers,
			Logger:  quiet,
		},
		Kinds: map[string]*stepwise.KindConfig{PayoutKind: {
			Sender:  fakebank.Sender{Client: bankClient},  // sends under the operation_id
			Checker: fakebank.Checker{Client: bankClient}, // looks up by operation_id
		}},
		Workflow:  &workflow.Config{Lease: 10 * time.Second},
		Reconcile: &reconcile.Config{Interval: time.Second},
		Logger:    quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	// River, and this process's maintenance loop (takeovers, delivery, reconciliation):
	// none of it waits for River's leader. Cancelling ctx cuts nothing; Stop drains.
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	prometheus.NewRegistry().MustRegister(client.Metrics()) // your registry

	// One run per key, forever: starting it again (a second cron fire, a retried request)
	// returns the same run.
	run, err := client.RunStart(ctx, "settle/2026-11-29", SettleArgs{Date: "2026-11-29"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	again, _ := client.RunStart(ctx, "settle/2026-11-29", SettleArgs{Date: "2026-11-29"}, nil)
	fmt.Println("created:", run.Created, "then:", again.Created)

	for run.Status != workflow.RunStatusSucceeded && run.Status != workflow.RunStatusFailed {
		time.Sleep(20 * time.Millisecond)
		if run, err = client.RunGet(ctx, run.Key); err != nil {
			log.Fatal(err)
		}
	}
	var settled int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM settlement").Scan(&settled)
	var steps int
	var cursor string
	_ = pool.QueryRow(ctx, "SELECT steps, cursor::text FROM stepwise_checkpoint WHERE key = $1", run.Key).Scan(&steps, &cursor)
	fmt.Printf("run %s: %d merchants settled in %d steps, cursor %s\n", run.Status, settled, steps, cursor)

	// The run is done; its payouts are done when none is left unproven.
	deadline := time.Now().Add(time.Minute)
	unproven := func() int {
		ops, err := client.OperationList(ctx, &stepwise.OperationListParams{RunKey: run.Key, Limit: 1000})
		if err != nil {
			log.Fatal(err)
		}
		n := 0
		for _, op := range ops {
			if !op.State.Terminal() && op.State != outbox.StateManual {
				n++
			}
		}
		return n
	}
	for unproven() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	var succeeded, wereUnknown int
	_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'SUCCEEDED'),
		(SELECT count(DISTINCT subject) FROM stepwise_event WHERE kind = 'op.transition' AND to_state = 'UNKNOWN_EXTERNAL')
		FROM stepwise_operation`).Scan(&succeeded, &wereUnknown)
	paidTwice := 0
	for id := 1; id <= 250; id++ {
		if bank.Effects(outbox.OperationID(PayoutKind, fmt.Sprintf("2026-11-29/%d", id)).String()) != 1 {
			paidTwice++
		}
	}
	fmt.Printf("payouts: %d succeeded, %d of them proven by the reconciler; merchants not paid exactly once: %d\n", succeeded, wereUnknown, paidTwice)

	// Shutdown (SIGTERM in a service): drain. Steps and sends in flight finish and are
	// recorded, none begins, leases are released; then River stops (past
	// Config.StopTimeout: cut, and the reconciler settles the cut sends).
	if err := client.Stop(ctx); err != nil {
		log.Fatal(err)
	}

	// Output:
	// created: true then: false
	// run succeeded: 250 merchants settled in 4 steps, cursor {"after_merchant": 250}
	// payouts: 250 succeeded, 1 of them proven by the reconciler; merchants not paid exactly once: 0
}
