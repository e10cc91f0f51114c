package settlement_test

import (
	"context"
	"math"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/schedule"
)

func TestMerchantShardMatchesShardOf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := schemaDB(t)
	codes := make([]string, 0, 2000)
	hashes := make([]int64, 0, 2000)
	for id := int64(1); id <= 2000; id++ {
		codes = append(codes, settlement.MerchantCode(id))
		hashes = append(hashes, settlement.ShardHash(settlement.MerchantCode(id)))
	}
	for _, n := range []int{1, 2, 3, 4, 7, 8, 10, 16, 61, 1000, 65537} {
		rows, err := pool.Query(ctx, `SELECT merchant_shard(h, $2) FROM unnest($1::bigint[]) WITH ORDINALITY AS u(h, o) ORDER BY o`, hashes, n)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		for i, code := range codes {
			require.Equal(t, schedule.ShardOf(code, n), int(got[i]), "code %s, n %d, hash %d", code, n, hashes[i])
		}
	}
}

// settleAll runs SettleBatch over every shard through plain pgx, one transaction per batch,
// as the settle step does without Stepwise.
func settleAll(t *testing.T, pool *pgxpool.Pool, shards, size int) (settlements, batches int) {
	t.Helper()
	ctx := context.Background()
	for shard := range shards {
		var after int64
		for {
			var res settlement.BatchResult
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				res, err = settlement.SettleBatch(ctx, tx, settlement.Batch{Date: testDate, Shard: shard, Shards: shards, AfterMerchant: after, Size: size})
				return err
			})
			require.NoError(t, err)
			require.GreaterOrEqual(t, res.LastMerchant, after)
			after = res.LastMerchant
			settlements += res.Settlements
			batches++
			if res.Done {
				break
			}
		}
	}
	return settlements, batches
}

func TestSettleBatchSettlesEveryGroupOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)

	n, batches := settleAll(t, pool, 3, 64)
	require.Greater(t, n, testSeed.Merchants/2)
	require.Greater(t, batches, 3)

	// One settlement per (merchant, type, currency) group of the date, with the group's sum.
	var groups, mismatched int
	require.NoError(t, pool.QueryRow(ctx, `
		WITH g AS (SELECT merchant_id, type, currency, sum(amount) s, count(*) c FROM card_txn
			WHERE business_date = $1 GROUP BY 1, 2, 3)
		SELECT count(*), count(*) FILTER (WHERE st.amount IS DISTINCT FROM g.s OR st.txn_count IS DISTINCT FROM g.c)
		FROM g LEFT JOIN settlement st ON (st.merchant_id, st.settle_date, st.type, st.currency) = (g.merchant_id, $1, g.type, g.currency)`,
		testDate).Scan(&groups, &mismatched))
	require.Equal(t, groups, n)
	require.Zero(t, mismatched)

	// Two balancing entries per settlement; one payout per settlement with its amount.
	var entries int
	var sum int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM ledger_entry`).Scan(&entries, &sum))
	require.Equal(t, 2*n, entries)
	require.Zero(t, sum)
	var ops, opMismatch int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE o.amount <> s.amount OR o.currency <> s.currency
			OR o.business_key <> s.settle_date || '/' || m.code || '/' || s.type || '/' || s.currency)
		FROM stepwise_operation o
		JOIN settlement s ON s.id = (o.payload->>'settlement_id')::bigint
		JOIN merchant m ON m.id = s.merchant_id
		WHERE o.kind = 'payout'`).Scan(&ops, &opMismatch))
	require.Equal(t, n, ops)
	require.Zero(t, opMismatch)

	// Settling again (a replayed run, a second run of the same date) creates nothing.
	again, _ := settleAll(t, pool, 3, 64)
	require.Zero(t, again)
	var total int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM settlement`).Scan(&total))
	require.Equal(t, n, total)
}

func TestSettleBatchRejectsBadShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := schemaDB(t)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := settlement.SettleBatch(ctx, tx, settlement.Batch{Date: testDate, Shard: 4, Shards: 4})
		return err
	})
	require.ErrorContains(t, err, "shard 4 of 4")
}

// TestSettleBatchReadsOnlyItsBatch guards the settle statement's plan on a connection that
// has not run it before. Such a connection plans a prepared statement for the values of its
// first five executions, and the planner guesses that the shard filter keeps 0.5% of
// merchants: a batch of 1,000 of 20,000 then looked like every merchant after the cursor, and
// the plan read them all and sorted them. The test counts the merchant rows each batch read,
// in the batch's own transaction (pg_stat_xact_user_tables), over enough batches to reach the
// generic plan too.
// TestSettleBatchHugeSize: a Size whose walk (Size × Shards) would overflow an int still
// settles the shard and finishes it. A walk that wrapped to 0 never moved the cursor nor
// finished the shard (an endless run), one that wrapped negative was an error.
func TestSettleBatchHugeSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	for _, c := range []struct{ size, shards int }{{1 << 62, 4}, {math.MaxInt, 2}, {math.MaxInt, 1}} {
		for shard := range c.shards {
			var res settlement.BatchResult
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				res, err = settlement.SettleBatch(ctx, tx, settlement.Batch{Date: testDate, Shard: shard, Shards: c.shards, Size: c.size})
				return err
			})
			require.NoError(t, err, "size %d, shard %d of %d", c.size, shard, c.shards)
			require.True(t, res.Done, "size %d, shard %d of %d: one batch covers the shard", c.size, shard, c.shards)
			require.Positive(t, res.Merchants, "size %d, shard %d of %d", c.size, shard, c.shards)
			require.Equal(t, int64(testSeed.Merchants), res.LastMerchant, "size %d, shard %d of %d: walked to the last merchant", c.size, shard, c.shards)
		}
	}
}

func TestSettleBatchReadsOnlyItsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := schemaDB(t)
	const merchants = 20_000
	_, err := settlement.Seed(ctx, pool, &settlement.SeedConfig{Date: testDate, Merchants: merchants, Transactions: merchants})
	require.NoError(t, err)

	check := func(t *testing.T, shards, size int) {
		// A connection of its own, as a pool opens one: no statement prepared on it yet.
		conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		var after int64
		// Seven batches: five planned for their own values, then the generic plan.
		for batch := range 7 {
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			// The counts a backend has not reported yet, which may include its earlier
			// transactions: the batch's are the difference.
			counts := func() (seqRead, idxFetched int64) {
				require.NoError(t, tx.QueryRow(ctx, `SELECT seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relname = 'merchant'`).Scan(&seqRead, &idxFetched))
				return seqRead, idxFetched
			}
			seq0, idx0 := counts()
			res, err := settlement.SettleBatch(ctx, tx, settlement.Batch{Date: testDate, Shard: 0, Shards: shards, AfterMerchant: after, Size: size})
			require.NoError(t, err)
			seq1, idx1 := counts()
			require.NoError(t, tx.Rollback(ctx))
			seqRead, read := seq1-seq0, seq1-seq0+idx1-idx0
			t.Logf("batch %d of shard 0 of %d: %d merchants settled, %d merchant rows read (%d by a sequential scan)", batch+1, shards, res.Merchants, read, seqRead)
			// The shard's next size merchants lie within about shards × size ids of the
			// cursor; a batch that read a quarter of the table read more than it needed.
			require.Lessf(t, read, int64(merchants/4),
				"batch %d of shard 0 of %d (after merchant %d, %d merchants a batch) read %d merchant rows (%d by a sequential scan) on a fresh connection",
				batch+1, shards, after, size, read, seqRead)
			// A batch walks shards × size ids: with one shard exactly size merchants, with
			// more about size, never more.
			if shards == 1 {
				require.Equal(t, size, res.Merchants, "batch %d: merchants settled", batch+1)
			} else {
				require.InDelta(t, size, res.Merchants, float64(size)/4, "batch %d: merchants settled", batch+1)
				require.LessOrEqual(t, res.Merchants, size, "batch %d: merchants settled", batch+1)
			}
			require.Greater(t, res.LastMerchant, after)
			after = res.LastMerchant
		}
	}
	// The merchant table's rows lie in id order, as the seed (and a table appended by id and
	// rarely updated) has them.
	t.Run("1 shard", func(t *testing.T) { check(t, 1, 1000) })
	t.Run("4 shards", func(t *testing.T) { check(t, 4, 500) })
	// Rows stored in another order: a table rewritten by shard (CLUSTER), or one whose
	// merchants were updated over the years. The heap order no longer follows the key, so the
	// planner prices a walk along the key as random reads.
	t.Run("rows out of id order", func(t *testing.T) {
		for _, q := range []string{`CREATE INDEX merchant_by_shard ON merchant (shard_hash)`,
			`CLUSTER merchant USING merchant_by_shard`, `DROP INDEX merchant_by_shard`, `VACUUM ANALYZE merchant`} {
			_, err := pool.Exec(ctx, q)
			require.NoError(t, err)
		}
		check(t, 1, 1000)
		check(t, 4, 500)
	})
}
