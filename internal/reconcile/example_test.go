package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// memoryBank applies payments by idempotency key and, to make the point, loses the answer to
// the first one: the caller cannot know the payment went through.
type memoryBank struct {
	mu       sync.Mutex
	payments map[string]reconcile.StatementEntry
}

func (b *memoryBank) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := reconcile.StatementEntry{Key: op.IdempotencyKey(), ExternalRef: "pay-" + op.BusinessKey,
		Amount: op.Amount, Currency: op.Currency, At: time.Now()}
	b.payments[e.Key] = e
	if op.BusinessKey == "m-1" {
		return outbox.Receipt{}, errors.New("read tcp: connection reset by peer") // applied, answer lost
	}
	return outbox.Receipt{ExternalRef: e.ExternalRef}, nil
}

func (b *memoryBank) Lookup(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.payments[op.IdempotencyKey()]
	if !ok {
		return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
	}
	return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: e.ExternalRef, Amount: e.Amount, Currency: e.Currency}, nil
}

func (b *memoryBank) Entries(ctx context.Context, from, to time.Time) ([]reconcile.StatementEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []reconcile.StatementEntry
	for _, e := range b.payments {
		if !e.At.Before(from) && e.At.Before(to) {
			out = append(out, e)
		}
	}
	return out, nil
}

func Example() {
	ctx := context.Background()
	pool, cleanup := testkit.ExampleDB(ctx) // a fresh database, migrated with migrations.Migrate
	defer cleanup()
	bank := &memoryBank{payments: map[string]reconcile.StatementEntry{}}
	quiet := slog.New(slog.DiscardHandler)

	ob, err := outbox.New(pool, &outbox.Config{Logger: quiet, Kinds: map[string]*outbox.KindConfig{"payout": {Sender: bank}}})
	if err != nil {
		log.Fatal(err)
	}
	// Record the outbox's kinds (stepwise.Client.Start does it in a service), or Enqueue
	// refuses the kind as one nothing would ever send.
	if err := ob.Register(ctx); err != nil {
		log.Fatal(err)
	}
	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: ob, Logger: quiet, Kinds: map[string]*reconcile.KindConfig{
		"payout": {Checker: bank},
	}})
	if err != nil {
		log.Fatal(err)
	}

	from := time.Now().Add(-time.Minute)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx,
			outbox.EnqueueParams{Kind: "payout", BusinessKey: "m-1", Amount: 1250, Currency: "EUR"},
			outbox.EnqueueParams{Kind: "payout", BusinessKey: "m-2", Amount: 990, Currency: "EUR"})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// In a service, River runs these (rec.Install, ob.Install); here they run on demand.
	if _, err := ob.Drain(ctx, "payout"); err != nil {
		log.Fatal(err)
	}
	printStates(ctx, pool)
	res, err := rec.RunOnce(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lookups:", res.Lookups)
	printStates(ctx, pool)

	totals, err := reconcile.CompareTotals(ctx, pool, bank, &reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("totals match:", totals.Match(), totals.Here["EUR"], totals.There["EUR"])
	// Output:
	// m-1 UNKNOWN_EXTERNAL
	// m-2 SUCCEEDED
	// lookups: map[succeeded:1]
	// m-1 SUCCEEDED
	// m-2 SUCCEEDED
	// totals match: true {2 2240} {2 2240}
}

func printStates(ctx context.Context, pool *pgxpool.Pool) {
	for _, key := range []string{"m-1", "m-2"} {
		op, err := outbox.Get(ctx, pool, outbox.OperationID("payout", key))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(key, op.State)
	}
}
