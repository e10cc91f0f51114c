package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/outbox"
)

// TestSeenVersionOfResolveAndResume: with --seen-version, resolve and resume refuse a payout
// or run that changed since it was read, even back to the state seen (ABA), and say what it
// is now; with the current version they act.
func TestSeenVersionOfResolveAndResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := seededDBURL(t)
	pool, err := openPool(ctx, dbURL, 0) // sized for a Service
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{Bank: dialBank(defaultBankURL, time.Second), Logger: quietLogger()})
	require.NoError(t, err)

	var settlementID int64
	require.NoError(t, pool.QueryRow(ctx, `
		WITH m AS (SELECT id FROM merchant ORDER BY id LIMIT 1)
		INSERT INTO settlement (merchant_id, settle_date, type, currency, amount, txn_count)
		VALUES ((SELECT id FROM m), $1, 'pos', 'EUR', 1000, 1) RETURNING id`, testDate).Scan(&settlementID))
	op := outbox.EnqueueParams{ID: settlement.PayoutID(testDate, "2026-03-01/M999998/pos/EUR"), Kind: settlement.PayoutKind, BusinessKey: "2026-03-01/M999998/pos/EUR", Amount: 1000, Currency: "EUR",
		Payload: []byte(`{"settlement_id": ` + itoa(settlementID) + `, "merchant": "M999998", "account": "X"}`)}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx, op)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	id := op.ID
	// MANUAL because never sent (test data: as the outbox leaves a payout it gave up on).
	_, err = pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'MANUAL', manual_reason = 'gave up: not sent after 25 attempts' WHERE operation_id = $1`, id)
	require.NoError(t, err)
	seen, err := svc.Client.OperationGet(ctx, id)
	require.NoError(t, err)
	// Someone sends it again; the send is ambiguous; the bank holds 999 EUR: MANUAL again.
	_, err = settlement.Resolve(ctx, svc.Client, settlement.Resolution{OperationID: id, From: outbox.StateManual, SeenVersion: seen.Version,
		To: outbox.StateRetryable, Actor: "bob", Reason: "INC-3: bank back, send again"})
	require.NoError(t, err)
	for _, st := range []string{"PROCESSING", "MANUAL"} {
		_, err = pool.Exec(ctx, `UPDATE stepwise_operation SET state = $2, lease_until = now() + interval '1 minute',
			manual_reason = 'mismatch: the external system holds 999 EUR' WHERE operation_id = $1`, id, st)
		require.NoError(t, err)
	}

	r := runCLI(t, "resolve", id.String(), "--from", "MANUAL", "--seen-version", itoa(seen.Version), "--to", "FAILED_PERMANENT",
		"--reason", "never sent", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "is MANUAL at version "+itoa(seen.Version+3)+" now, not MANUAL at version "+itoa(seen.Version))
	require.Contains(t, r.stderr, "999 EUR")
	// Without --from, the refusal names only what the person gave: the version, not a state
	// read just now as if it were theirs.
	r = runCLI(t, "resolve", id.String(), "--seen-version", itoa(seen.Version), "--to", "FAILED_PERMANENT",
		"--reason", "never sent", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "is MANUAL at version "+itoa(seen.Version+3)+" now, not version "+itoa(seen.Version)+" as you saw")
	now, err := svc.Client.OperationGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StateManual, now.State)

	r = runCLI(t, "resolve", id.String(), "--from", "MANUAL", "--seen-version", itoa(now.Version), "--to", "SUCCEEDED",
		"--reason", "TICKET-4: the bank confirms 999 EUR paid", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "is now SUCCEEDED (version "+itoa(now.Version+1)+")")

	// A run failed, resumed by someone, run and failed again.
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) VALUES ('settle/seen/0')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input) VALUES ('settle/seen/0', 'settle_shard', '{}')`)
	require.NoError(t, err)
	for _, st := range []string{"running", "failed", "pending", "running", "failed"} {
		_, err = pool.Exec(ctx, `UPDATE stepwise_run SET status = $1 WHERE key = 'settle/seen/0'`, st)
		require.NoError(t, err)
	}
	run, err := workflow.GetRun(ctx, pool, "settle/seen/0")
	require.NoError(t, err)
	r = runCLI(t, "resume", "settle/seen/0", "--seen-version", itoa(run.Version-3), "--reason", "INC-3: bank back", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "changed status 3 time(s)")
	require.Contains(t, r.stderr, "it is failed now")
	r = runCLI(t, "resume", "settle/seen/0", "--seen-version", "0x", "--reason", "x", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 2, r.code)
	r = runCLI(t, "resume", "settle/seen/0", "--seen-version", itoa(run.Version), "--reason", "INC-3: bank back", "--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	run, err = workflow.GetRun(ctx, pool, "settle/seen/0")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusPending, run.Status)
}
