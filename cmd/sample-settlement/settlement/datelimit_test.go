package settlement_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/outbox"
)

// dateLedger is a migrated database with the sample's schema and nothing settled, for tests
// that write their own ledger, and the run keys of testDate under a plan of 4 shards.
func dateLedger(t *testing.T) (*pgxpool.Pool, []string) {
	t.Helper()
	pool := testkit.DB(t)
	require.NoError(t, settlement.ApplySchema(context.Background(), pool))
	plan, err := settlement.Plan{Shards: 4}.Compile()
	require.NoError(t, err)
	keys, err := plan.RunKeys(testDate)
	require.NoError(t, err)
	return pool, keys
}

// report and invariants read the date asked for, not the whole ledger. The
// query of a date's payouts must be able to use an index (the run_key index, through the
// date's run keys) instead of scanning every payout ever made; on 616d8b1 it filtered on
// split_part(business_key, '/', 2), which no index serves.
func TestDatePayoutsReadOnlyTheDate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, keys := dateLedger(t)
	// A ledger with history: 20000 payouts of 50 older dates, then statistics.
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state)
		SELECT gen_random_uuid(), $1, (date '2026-01-01' + g / 400)::text || '/' || (g % 400) || '/merchant/EUR', '{}', '\x00',
		       'settle/' || (date '2026-01-01' + g / 400)::text || '/' || (g % 4), 'SUCCEEDED'
		  FROM generate_series(1, 20000) g`, settlement.PayoutKind)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE stepwise_operation`)
	require.NoError(t, err)
	explain := func(sql string, args ...any) string {
		var lines []string
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// With seq scans priced out, the plan shows whether any index can serve the query.
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
			if err != nil {
				return err
			}
			lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		}))
		return strings.Join(lines, "\n")
	}
	plan616 := explain(`SELECT operation_id::text FROM stepwise_operation WHERE kind = $1 AND split_part(business_key, '/', 2) = $2`,
		settlement.PayoutKind, testDate.Format("2006-01-02"))
	now := explain(settlement.DatePayoutsSQL, settlement.PayoutKind, testDate.Format("2006-01-02"), keys)
	t.Logf("616d8b1's query:\n%s\nnow:\n%s", plan616, now)
	require.NotContains(t, now, "Seq Scan on stepwise_operation", "the date's payouts must not scan the whole ledger")
	// Any index on run_key serves it (migration 006 replaced the first one with the
	// console's (run_key, state, created_at) index).
	require.Contains(t, now, "Index Cond: (run_key")

	// The other date-limited reads of report and invariants. Invariant 1b read every payout
	// of the kind (20000 here, through the kind index) and filtered on the business key; now
	// by the date's run keys. Invariant 4's lapsed leases and the report's oldest unknown
	// payout are served by the partial indexes of leased and unknown payouts (the few in
	// flight, not the history), and now also carry the run keys.
	for name, q := range map[string]struct {
		sql  string
		args []any
		want string
	}{
		"invariant 1b":            {settlement.Invariant1bSQL, []any{settlement.PayoutKind, testDate, keys}, "Index Cond: (run_key"},
		"invariant 4 (lapsed)":    {settlement.Invariant4LapsedSQL, []any{settlement.PayoutKind, testDate.Format("2006-01-02"), keys}, "Index Cond: ("},
		"report (oldest unknown)": {settlement.OldestUnknownSQL, []any{settlement.PayoutKind, testDate.Format("2006-01-02"), keys}, "Index Cond: ("},
	} {
		plan := explain(q.sql, q.args...)
		t.Logf("%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on stepwise_operation", "%s scans the whole ledger", name)
		require.Contains(t, plan, q.want, "%s does not read the date through an index", name)
	}
}

// Payout keys began with the merchant before they began with the date. A ledger from before
// keeps its reports: a date's payouts are read in both shapes, and only that date's.
func TestDatePayoutsReadBothKeyShapes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, keys := dateLedger(t)
	date := testDate.Format("2006-01-02")
	other := testDate.AddDate(0, 0, 1).Format("2006-01-02")
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state)
		SELECT gen_random_uuid(), $1, k, '{}', '\x00', $2, 'SUCCEEDED'
		  FROM unnest($3::text[]) k`, settlement.PayoutKind, keys[0], []string{
		date + "/M000001/pos/EUR", "M000002/" + date + "/pos/EUR", // the date's, in both shapes
		other + "/M000003/pos/EUR", "M000004/" + other + "/pos/EUR", // another date's, under the same run key
	})
	require.NoError(t, err)
	rows, err := pool.Query(ctx, settlement.DatePayoutsSQL, settlement.PayoutKind, date, keys)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var id, key, state, cur string
		var amount int64
		require.NoError(t, rows.Scan(&id, &key, &state, &amount, &cur))
		got = append(got, key)
	}
	require.NoError(t, rows.Err())
	require.ElementsMatch(t, []string{date + "/M000001/pos/EUR", "M000002/" + date + "/pos/EUR"}, got)

	// The lapsed leases of invariant 4 and the report's oldest unknown payout, in both shapes
	// too: the old-shape payout is the oldest unknown, the other date's older still.
	_, err = pool.Exec(ctx, `
		INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state, lease_until, next_check_at, unknown_since)
		SELECT gen_random_uuid(), $1, k, '{}', '\x00', $2, s, now() - interval '1 minute', now(), now() - a * interval '1 hour'
		  FROM unnest($3::text[], $4::text[], $5::int[]) AS u(k, s, a)`, settlement.PayoutKind, keys[1],
		[]string{date + "/M000005/pos/EUR", "M000006/" + date + "/pos/EUR", date + "/M000007/pos/EUR", "M000008/" + date + "/pos/EUR", other + "/M000009/pos/EUR"},
		[]string{"PROCESSING", "PROCESSING", "UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL"},
		[]int{0, 0, 1, 2, 3})
	require.NoError(t, err)
	var lapsed int
	require.NoError(t, pool.QueryRow(ctx, settlement.Invariant4LapsedSQL, settlement.PayoutKind, date, keys).Scan(&lapsed))
	require.Equal(t, 2, lapsed)
	var oldest float64
	require.NoError(t, pool.QueryRow(ctx, settlement.OldestUnknownSQL, settlement.PayoutKind, date, keys).Scan(&oldest))
	require.InDelta(t, 7200, oldest, 60)

	require.True(t, settlement.ReferenceOfDate(date+"/M000001/pos/EUR", date))
	require.True(t, settlement.ReferenceOfDate("M000002/"+date+"/pos/EUR", date))
	require.False(t, settlement.ReferenceOfDate(other+"/M000003/pos/EUR", date))
	require.False(t, settlement.ReferenceOfDate("M000004/"+other+"/pos/EUR", date))
}

// ApplySchema records from which date payouts are dated, once: every date on a new database;
// on one a build from before dated ids used, from the day after the latest of three days after
// today and every date settled or started (a year ahead at most); never again once recorded.
func TestPayoutSchemeIsRecordedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	var from time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT dated_from FROM payout_scheme`).Scan(&from))
	require.Equal(t, 1, from.Year(), "a new database dates every payout")

	// Fixed: no update, delete or truncate.
	for _, sql := range []string{`UPDATE payout_scheme SET dated_from = date '2030-01-01'`, `DELETE FROM payout_scheme`, `TRUNCATE payout_scheme`} {
		_, err := pool.Exec(ctx, sql)
		require.ErrorContains(t, err, "payout_scheme is fixed once recorded", sql)
	}

	// Its row lost on a ledger that holds dated payouts: recording a new date is refused.
	settleAll(t, pool, 1, 1000)
	_, err := pool.Exec(ctx, `DROP TABLE payout_scheme`)
	require.NoError(t, err)
	require.ErrorContains(t, settlement.ApplySchema(ctx, pool), "restore the row")

	// A database from before dated ids: what it records, by what it holds.
	_, err = pool.Exec(ctx, `DELETE FROM stepwise_operation WHERE kind = 'payout'`)
	require.NoError(t, err)
	// Days are counted from today in UTC, as the schema does; a midnight between the setup and
	// the check would shift them, so that attempt is made again.
	const today = `(now() AT TIME ZONE 'UTC')::date`
	recorded := func(setup string) int {
		t.Helper()
		for {
			var before, after time.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT `+today).Scan(&before))
			_, err := pool.Exec(ctx, `DROP TABLE IF EXISTS payout_scheme; DELETE FROM ledger_entry; DELETE FROM settlement;
				DELETE FROM stepwise_run WHERE workflow = 'settle_merchants'; `+setup)
			require.NoError(t, err)
			require.NoError(t, settlement.ApplySchema(ctx, pool))
			var days int
			require.NoError(t, pool.QueryRow(ctx, `SELECT dated_from - `+today+`, `+today+` FROM payout_scheme`).Scan(&days, &after))
			if after.Equal(before) {
				return days
			}
		}
	}
	settlementOn := func(days int) string {
		return fmt.Sprintf(`INSERT INTO settlement (merchant_id, settle_date, type, currency, amount, txn_count)
			SELECT id, %s + %d, 'pos', 'EUR', 1, 1 FROM merchant ORDER BY id LIMIT 1;`, today, days)
	}
	runOn := func(key, date string) string {
		return fmt.Sprintf(`INSERT INTO stepwise_checkpoint (key) VALUES ('%[1]s') ON CONFLICT DO NOTHING;
			INSERT INTO stepwise_run (key, workflow, input, status) VALUES ('%[1]s', 'settle_merchants', jsonb_build_object('date', %[2]s), 'failed');`, key, date)
	}
	require.Equal(t, 4, recorded(settlementOn(-30)), "a settlement of the past: three days after today, and one")
	require.Equal(t, 31, recorded(settlementOn(30)), "a date settled ahead: the day after it")
	require.Equal(t, 4, recorded(settlementOn(400)), "more than a year ahead: a mistake, not a date in progress")
	require.Equal(t, 11, recorded(
		runOn("t/bad", "'2026-02-30'")+runOn("t/inf", "'infinity'")+runOn("t/text", "'today'")+
			runOn("t/far", "("+today+" + 400)::text")+runOn("t/ahead", "("+today+" + 10)::text")),
		"settle runs only: the latest plausible date started, one malformed input changing nothing")
	ok, err := settlement.SchemaApplied(ctx, pool)
	require.NoError(t, err)
	require.True(t, ok)
}

// A date on or after payout_scheme's date gets dated ids and date-first keys; a date before it,
// the keys and ids of the builds before. The step reads the date in its own transaction.
func TestPayoutSchemeDecidesByDate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		from   time.Time
		legacy bool
	}{{testDate, false}, {testDate.AddDate(0, 0, 1), true}} {
		pool := seededDB(t)
		setPayoutScheme(t, pool, c.from)
		settleAll(t, pool, 1, 1000)
		rows, err := pool.Query(ctx, `SELECT operation_id::text, business_key FROM stepwise_operation WHERE kind = $1`, settlement.PayoutKind)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ ID, Key string }])
		require.NoError(t, err)
		require.NotEmpty(t, got)
		for _, p := range got {
			if c.legacy {
				require.Regexp(t, `^M\d{6}/2026-03-01/`, p.Key)
				require.Equal(t, outbox.OperationID(settlement.PayoutKind, p.Key).String(), p.ID)
			} else {
				require.Regexp(t, `^2026-03-01/M\d{6}/`, p.Key)
				require.Equal(t, settlement.PayoutID(testDate, p.Key).String(), p.ID)
			}
		}
	}
}

// setPayoutScheme sets payout_scheme's date past its triggers, as no program may: a test's
// stand-in for a database recorded with that date.
func setPayoutScheme(t *testing.T, pool *pgxpool.Pool, from time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `ALTER TABLE payout_scheme DISABLE TRIGGER payout_scheme_is_fixed;
		UPDATE payout_scheme SET dated_from = '`+from.Format(time.DateOnly)+`';
		ALTER TABLE payout_scheme ENABLE TRIGGER payout_scheme_is_fixed`)
	require.NoError(t, err)
}

// A business date is one instant, midnight UTC: Berlin's midnight of the same date would name
// its payouts by one day in the key and scheme and by another in the id.
func TestSettleBatchRefusesADateThatIsNotMidnightUTC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := settlement.SettleBatch(ctx, tx, settlement.Batch{Date: time.Date(2026, 3, 1, 0, 0, 0, 0, berlin), Shards: 1})
		return err
	})
	require.ErrorContains(t, err, "is not a business date's midnight UTC; use ParseDate")
	// The same instant shown in another zone is the same date, even where that zone's calendar
	// still reads the day before (New York: 2026-02-28, 19:00).
	newYork, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := settlement.SettleBatch(ctx, tx, settlement.Batch{Date: testDate.In(newYork), Shards: 1, Size: 10})
		return err
	}))
	var keys int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation WHERE business_key LIKE '2026-03-01/%'`).Scan(&keys))
	require.Positive(t, keys)
	var settled, other int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE settle_date = '2026-03-01'), count(*) FILTER (WHERE settle_date <> '2026-03-01') FROM settlement`).Scan(&settled, &other))
	require.Positive(t, settled)
	require.Zero(t, other, "the settlements are of the date, not of New York's calendar day")
}
