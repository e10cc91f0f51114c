package reconcile

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// TestTotalsReadOneRangeOfTheIndex: the ledger's side of a comparison is an index scan of
// stepwise_operation_totals_idx bounded by the period. Guards against the expression in
// sentAt drifting from migration 012's: the planner would then read every SUCCEEDED
// operation of the kind for any day, the unbounded Totals this index exists to prevent.
func TestTotalsReadOneRangeOfTheIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The table is empty: forbid the sequential scan the planner would rightly prefer,
		// so that only an unusable index shows.
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		rows, err := tx.Query(ctx, `EXPLAIN `+ledgerSQL, "payout", from, from.AddDate(0, 0, 1))
		if err != nil {
			return err
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		text := strings.Join(plan, "\n")
		t.Log(text)
		require.Contains(t, text, "Index Only Scan using stepwise_operation_totals_idx")
		require.NotContains(t, text, "Sort", "streamed in index order, sorted by nobody")
		return nil
	}))
}
