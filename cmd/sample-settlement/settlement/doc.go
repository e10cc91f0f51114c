/*
Package settlement is the business domain of the sample settlement service: merchants, card
transactions, daily settlement per (merchant, settle date, type, currency), double-entry
ledger entries, and a payout per settlement through Stepwise's operation ledger.

# Settling

A date is settled by N runs, one per shard; a merchant's shard is workflow.ShardOf(code, N),
which the SQL function merchant_shard computes from the stored hash. Each step of a run is one
SettleBatch: one statement settles the next batch of merchants after the cursor (sums,
settlements, ledger entries), and one outbox.Enqueue writes their payouts, in the step's
transaction:

	res, err := settlement.SettleBatch(ctx, tx, settlement.Batch{
		Date: date, Shard: 3, Shards: 8, AfterMerchant: cursor, Size: 500, RunKey: runKey,
	})
	// commit tx; the next batch starts after res.LastMerchant; res.Done ends the shard.

The settlement's business key is unique, so a replayed step creates nothing twice.
*/
package settlement
