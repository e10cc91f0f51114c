package retention

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// A batch of operation events must find each event's operation by its primary key, not by
// joining every operation of the ledger: the join used to be on 'op:' || operation_id::text,
// which no index serves, so each batch of 500 events hash-joined the whole ledger and sorted
// every old event. On a ledger of 100,000 operations that was 0.5s per batch on a busy 2-core
// machine, and it grows with the ledger: at 10M operations the 18,000 batches of 9M old events
// would never finish, while each held the database (the bench's history section found it).
// The plan of the batch's selection, on a ledger of 20,000 settled operations with their
// events, must not scan the operations.
func TestOperationEventsBatchReadsByPrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	seedSettledOperations(t, pool, 20000)
	_, err := pool.Exec(ctx, `ANALYZE stepwise_operation; ANALYZE stepwise_event`)
	require.NoError(t, err)

	rows, err := pool.Query(ctx, "EXPLAIN (COSTS off) "+operationEventsBatchSQL, time.Now().Add(-30*24*time.Hour), 500, time.Time{})
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	t.Logf("plan of a batch:\n%s", text)
	require.NotContains(t, text, "Seq Scan on stepwise_operation", "a batch must not read the whole ledger:\n%s", text)
	require.Contains(t, text, "stepwise_operation_pkey", "a batch must find each event's operation by its id:\n%s", text)
	require.Contains(t, text, "Index Scan using stepwise_event_at_idx", "a batch must walk the old events oldest first, not sort them all:\n%s", text)

	// And it still deletes exactly the batch.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	n, _, err := pruneOperationEvents(ctx, tx, time.Now().Add(-30*24*time.Hour), time.Time{}, 500)
	require.NoError(t, err)
	require.EqualValues(t, 500, n)
}

// A batch of runs must ask, per run, whether it wrote an operation not yet settled, by the
// run_key index: the NOT EXISTS of before was planned as an anti-join against a sequential
// scan of the whole ledger (materialized once per batch, estimated at one row): at 3M
// operations each batch took longer than the bench's 2s prune windows, so not one run was
// pruned in 4 minutes, and at 10M every batch read the whole ledger.
func TestRunBatchAsksTheLedgerByRunKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `
		INSERT INTO stepwise_checkpoint (key) SELECT 'old/' || j FROM generate_series(1, 20000) j;
		INSERT INTO stepwise_run (key, workflow, input, status, created_at, updated_at, finished_at)
		SELECT 'old/' || j, 'settle', '{}', 'succeeded', t, t, t
		  FROM generate_series(1, 20000) j, LATERAL (SELECT now() - interval '90 days' + j * interval '1 minute' AS t) tt;
		INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state, created_at, updated_at)
		SELECT gen_random_uuid(), 'payout', 'bk-' || i, '{}', '\x00', 'old/' || (i % 20000 + 1), 'SUCCEEDED', now(), now()
		  FROM generate_series(1, 200000) i;
		ANALYZE stepwise_run; ANALYZE stepwise_operation; ANALYZE stepwise_checkpoint`)
	require.NoError(t, err)
	sel := succeededBefore(time.Now().Add(-30*24*time.Hour), time.Time{}, 500)
	rows, err := pool.Query(ctx, "EXPLAIN (COSTS off) "+sel.sql, sel.args...)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	t.Logf("plan of a batch of runs:\n%s", text)
	require.NotContains(t, text, "Seq Scan on stepwise_operation", "a batch of runs must not read the whole ledger:\n%s", text)
	require.Regexp(t, `Index (Only )?Scan using stepwise_operation_\w+ on stepwise_operation o\s+Index Cond: \(\(run_key = r\.key\) AND \(state = ANY`, text,
		"a batch of runs must ask the ledger by run key and the unsettled states (index seeks):\n%s", text)
}
