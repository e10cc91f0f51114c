package main

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/outbox"
)

func TestHelpOnEveryCommand(t *testing.T) {
	t.Parallel()
	mine := []string{"demo", "serve", "seed", "migrate", "settle", "report", "resolve", "invariants", "prune", "statement-arrived"}
	for _, name := range mine {
		r := runCLI(t, name, "--help")
		require.Equal(t, 0, r.code, name)
		require.Contains(t, r.stderr, "usage: sample-settlement "+name, name)
	}
	r := runCLI(t, "help")
	require.Equal(t, 0, r.code)
	for _, name := range mine {
		require.Contains(t, r.stdout, "  "+name+" ")
	}
	r = runCLI(t, "settel")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `unknown command "settel"`)
}

// Bad input: a malformed date is refused before anything runs, naming the flag and the form.
func TestBadDate(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"report", "invariants", "settle", "seed"} {
		r := runCLI(t, cmd, "--database-url", "postgres://nobody@127.0.0.1:1/none", "--date", "2026-13-01")
		require.Equal(t, 2, r.code, cmd)
		require.Contains(t, r.stderr, `--date "2026-13-01": want YYYY-MM-DD`, cmd)
	}
	r := runCLI(t, "report", "--database-url", "postgres://nobody@127.0.0.1:1/none")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--date is required")
}

// Bad input: a database that does not answer is named, with the fix, and nothing else runs.
func TestDatabaseDoesNotAnswer(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"report", "--date", testDateText},
		{"migrate"},
		{"resolve", uuid.NewString(), "--to", "SUCCEEDED", "--reason", "x", "--actor", "me"},
		{"demo"},
	} {
		r := runCLI(t, append(args, "--database-url", "postgres://postgres@127.0.0.1:1/stepwise")...)
		require.Equal(t, 1, r.code, args[0])
		require.Contains(t, r.stderr, "127.0.0.1:1/stepwise does not answer", args[0])
		require.Contains(t, r.stderr, "fix DATABASE_URL", args[0])
	}
	r := runCLI(t, "report", "--date", testDateText, "--database-url", "")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "no database: set DATABASE_URL")
}

// Bad input: an operation id that is not one, or names nothing, is refused clearly and
// changes nothing.
func TestResolveUnknownOperation(t *testing.T) {
	t.Parallel()
	dbURL := seededDBURL(t)
	r := runCLI(t, "resolve", "not-a-uuid", "--to", "SUCCEEDED", "--reason", "x", "--actor", "me", "--database-url", dbURL)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `OP_ID "not-a-uuid": want an operation id (a UUID`)

	id := uuid.NewString()
	r = runCLI(t, "resolve", id, "--to", "SUCCEEDED", "--reason", "bank confirmed", "--actor", "me", "--database-url", dbURL)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "operation "+id+" does not exist")

	r = runCLI(t, "resolve", id, "--to", "PAID", "--reason", "x", "--database-url", dbURL)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--to "PAID": want SUCCEEDED, FAILED_PERMANENT or RETRYABLE`)

	r = runCLI(t, "resolve", id, "--to", "SUCCEEDED", "--database-url", dbURL)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--reason is required")
}

// Bad input: a resolution decided on a stale screen (the person saw MANUAL, the reconciler
// has since proven the payout SUCCEEDED) is refused, and nothing changes: not the payout,
// not its settlement, not the audit trail.
func TestResolveFromStaleState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := seededDBURL(t)
	pool, err := openPool(ctx, dbURL, 0) // sized for a Service
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// One settled payout, moved to MANUAL and then (by "the reconciler") to SUCCEEDED.
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{Bank: dialBank(defaultBankURL, time.Second), Logger: quietLogger()})
	require.NoError(t, err)
	_, _, err = svc.StartDate(ctx, testDate)
	require.NoError(t, err)
	var id uuid.UUID
	var settlementID int64
	require.NoError(t, pool.QueryRow(ctx, `
		WITH m AS (SELECT id, code FROM merchant WHERE id IN (SELECT merchant_id FROM card_txn) ORDER BY id LIMIT 1),
		     s AS (INSERT INTO settlement (merchant_id, settle_date, type, currency, amount, txn_count)
		           VALUES ((SELECT id FROM m), $1, 'pos', 'EUR', 1234, 1) RETURNING id)
		SELECT (SELECT id FROM s), (SELECT code FROM m)`, testDate).Scan(&settlementID, new(string)))
	op := outbox.EnqueueParams{ID: settlement.PayoutID(testDate, "2026-03-01/M999999/pos/EUR"), Kind: settlement.PayoutKind, BusinessKey: "2026-03-01/M999999/pos/EUR", Amount: 1234, Currency: "EUR",
		Payload: []byte(`{"settlement_id": ` + itoa(settlementID) + `, "merchant": "M999999", "account": "X"}`)}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx, op)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	id = op.ID
	_, err = pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'MANUAL', manual_reason = 'test' WHERE operation_id = $1`, id)
	require.NoError(t, err)
	read, err := settlement.Resolvable(ctx, svc.Client, id, outbox.StateManual)
	require.NoError(t, err)
	_, err = settlement.Resolve(ctx, svc.Client, settlement.Resolution{OperationID: id, From: outbox.StateManual, SeenVersion: read.Version,
		To: outbox.StateSucceeded, Actor: "reconcile-stand-in", Reason: "found paid"})
	require.NoError(t, err)
	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE subject = $1`, "op:"+id.String()).Scan(&events))

	r := runCLI(t, "resolve", id.String(), "--from", "MANUAL", "--to", "FAILED_PERMANENT", "--reason", "bank says no", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "is SUCCEEDED now, not MANUAL as you saw")
	require.Contains(t, r.stderr, "nothing was changed")

	// Without --from, only MANUAL and UNKNOWN_EXTERNAL payouts are resolvable at all.
	r = runCLI(t, "resolve", id.String(), "--to", "FAILED_PERMANENT", "--reason", "bank says no", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "is SUCCEEDED; only MANUAL and UNKNOWN_EXTERNAL payouts are resolved by hand")
	require.NotContains(t, r.stderr, "state you saw")

	got, err := svc.Client.OperationGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, got.State)
	var status string
	var after int
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM settlement WHERE id = $1`, settlementID).Scan(&status))
	require.Equal(t, settlement.StatusPaid, status)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE subject = $1`, "op:"+id.String()).Scan(&after))
	require.Equal(t, events, after, "a refused resolution writes no audit event")
}

// The demo end to end at a small size, on a database the test names (so it drops nothing):
// it must finish with every invariant holding and exit 0.
func TestDemoSmall(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "demo", "--database-url", testkit.DBURL(t), "--merchants", "300", "--transactions", "3000", "--workers", "2")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "database: the one DATABASE_URL names (used as is; the demo drops nothing)")
	require.Contains(t, r.stdout, "workers: 2 River clients")
	require.Contains(t, r.stdout, "all invariants hold")
	require.Contains(t, r.stdout, "demo finished in")
}
