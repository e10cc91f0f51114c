package settlement_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// Settling a date through plain pgx, one transaction per batch of merchants: what the settle
// step does inside Stepwise, where the cursor is checkpointed and the commit fenced.
func ExampleSettleBatch() {
	ctx := context.Background()
	pool, cleanup := testkit.ExampleDB(ctx)
	defer cleanup()
	if err := settlement.ApplySchema(ctx, pool); err != nil {
		log.Fatal(err)
	}
	// The settle step enqueues payouts; the Service registers their kind when it starts.
	if err := settlement.RegisterPayoutKind(ctx, pool); err != nil {
		log.Fatal(err)
	}
	date := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	seeded, err := settlement.Seed(ctx, pool, &settlement.SeedConfig{Date: date, Merchants: 100, Transactions: 1000, Seed: 42})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("transactions:", seeded.Transactions)

	const shards = 2
	total := 0
	for shard := range shards {
		var after int64 // the cursor: the last merchant walked past
		for {
			var res settlement.BatchResult
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				res, err = settlement.SettleBatch(ctx, tx, settlement.Batch{
					Date: date, Shard: shard, Shards: shards, AfterMerchant: after, Size: 25,
				})
				return err
			})
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("shard %d: %d merchants after id %d, up to %d: %d settlements\n", shard, res.Merchants, after, res.LastMerchant, res.Settlements)
			total += res.Settlements
			after = res.LastMerchant
			if res.Done {
				break
			}
		}
	}

	var payouts int
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM stepwise_operation WHERE kind = 'payout'),
		(SELECT sum(amount) FROM ledger_entry)`).Scan(&payouts, &balance); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d settlements, %d payouts enqueued, ledger balance %d\n", total, payouts, balance)
	fmt.Println(settlement.PayoutKey("M000042", date, "pos", "EUR"))
	// Output:
	// transactions: 1000
	// shard 0: 24 merchants after id 0, up to 50: 64 settlements
	// shard 0: 25 merchants after id 50, up to 99: 49 settlements
	// shard 0: 0 merchants after id 99, up to 100: 0 settlements
	// shard 1: 25 merchants after id 0, up to 49: 67 settlements
	// shard 1: 25 merchants after id 49, up to 98: 58 settlements
	// shard 1: 1 merchants after id 98, up to 100: 3 settlements
	// 241 settlements, 241 payouts enqueued, ledger balance 0
	// 2026-03-01/M000042/pos/EUR
}
