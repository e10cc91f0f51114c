package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

func Example() {
	ctx := context.Background()
	pool, cleanup := testkit.ExampleDB(ctx) // a fresh database, migrated with migrations.Migrate
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE settlement (merchant text PRIMARY KEY, amount bigint, status text)`); err != nil {
		log.Fatal(err)
	}

	// The external system: here a function; in a service, an HTTP call through
	// outbox/httpsend (no resend by net/http itself, outbox.NotSent only when the wire proves
	// the request never left, anything else UNKNOWN_EXTERNAL) and its Rules for the answers.
	bank := outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
		return outbox.Receipt{ExternalRef: "pay-" + op.BusinessKey}, nil // key: op.IdempotencyKey()
	})
	ob, err := outbox.New(pool, &outbox.Config{
		Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": {
			Sender: bank,
			// Business state moves in the transaction that records the outcome.
			OnOutcome: func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, oc outbox.Outcome) error {
				if oc.To != outbox.StateSucceeded {
					return nil
				}
				_, err := tx.Exec(ctx, `UPDATE settlement SET status = 'PAID' WHERE merchant = $1`, op.BusinessKey)
				return err
			},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}

	// Wiring: the outbox's workers, poll and queues go into your own River client.
	riverConfig := &river.Config{Logger: slog.New(slog.DiscardHandler)}
	if err := ob.Install(riverConfig); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), riverConfig)
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Register(ctx); err != nil { // records the kinds, so that Enqueue accepts them
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx) //nolint:errcheck

	// A step: business rows and their payouts commit together, or neither does. Inside a
	// River worker the context already carries the client that wakes the dispatcher.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var ops []outbox.EnqueueParams
		for i, amount := range []int64{1250, 990} {
			merchant := fmt.Sprintf("m-%d", i+1)
			if _, err := tx.Exec(ctx, `INSERT INTO settlement VALUES ($1, $2, 'SETTLED')`, merchant, amount); err != nil {
				return err
			}
			payload, _ := json.Marshal(map[string]string{"account": "acct-" + merchant})
			ops = append(ops, outbox.EnqueueParams{Kind: "payout", BusinessKey: merchant, Payload: payload, Amount: amount, Currency: "EUR"})
		}
		_, err := outbox.Enqueue(ob.Local().Context(ctx, client), tx, ops...)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// The dispatcher delivers in the background; wait for it.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ops, _ := outbox.List(ctx, pool, &outbox.ListParams{State: outbox.StateSucceeded}); len(ops) == 2 {
			break
		}
	}
	rows, err := pool.Query(ctx, `
		SELECT s.merchant, s.status, o.state, o.external_ref
		FROM settlement s JOIN stepwise_operation o ON o.business_key = s.merchant ORDER BY 1`)
	if err != nil {
		log.Fatal(err)
	}
	for rows.Next() {
		var merchant, status, state, ref string
		if err := rows.Scan(&merchant, &status, &state, &ref); err != nil {
			log.Fatal(err)
		}
		fmt.Println(merchant, status, state, ref)
	}
	// Output:
	// m-1 PAID SUCCEEDED pay-m-1
	// m-2 PAID SUCCEEDED pay-m-2
}
