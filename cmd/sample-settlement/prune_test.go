package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/outbox"
)

// The audit trail keeps a person's decision (who, why, when) forever, as the usage errors of
// --actor and --reason promise: a payout resolved by hand with `resolve`, then `prune` once
// its history is old, still shows who marked it SUCCEEDED and why. `prune --help` says what
// is kept.
func TestPruneKeepsWhoResolved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := seededDBURL(t)
	pool, err := openPool(ctx, dbURL, 0) // sized for a Service
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// The service registers the payout kind, as a serve process does.
	_, err = settlement.NewService(pool, &settlement.ServiceConfig{Bank: dialBank(defaultBankURL, time.Second), Logger: quietLogger()})
	require.NoError(t, err)

	// A payout of a settlement, MANUAL after the dispatcher and the reconciler gave up.
	var settlementID int64
	require.NoError(t, pool.QueryRow(ctx, `
		WITH m AS (SELECT id FROM merchant WHERE id IN (SELECT merchant_id FROM card_txn) ORDER BY id LIMIT 1)
		INSERT INTO settlement (merchant_id, settle_date, type, currency, amount, txn_count)
		VALUES ((SELECT id FROM m), $1, 'pos', 'EUR', 1234, 1) RETURNING id`, testDate).Scan(&settlementID))
	op := outbox.EnqueueParams{ID: settlement.PayoutID(testDate, "2026-03-01/M999998/pos/EUR"), Kind: settlement.PayoutKind, BusinessKey: "2026-03-01/M999998/pos/EUR", Amount: 1234, Currency: "EUR",
		Payload: []byte(`{"settlement_id": ` + itoa(settlementID) + `, "merchant": "M999998", "account": "X"}`)}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, op)
		return err
	}))
	id := op.ID
	subject := "op:" + id.String()
	_, err = pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'MANUAL', manual_reason = 'gave up: 5 checks' WHERE operation_id = $1`, id)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor) VALUES
		($1, 'op.transition', 'PENDING', 'PROCESSING', 'dispatcher-1'),
		($1, 'op.transition', 'PROCESSING', 'UNKNOWN_EXTERNAL', 'dispatcher-1')`, subject)
	require.NoError(t, err)

	var version int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM stepwise_operation WHERE operation_id = $1`, id).Scan(&version))
	// Without the version seen, the command refuses, says what the payout is now, and changes nothing.
	r := runCLI(t, "resolve", id.String(), "--from", "MANUAL", "--to", "SUCCEEDED", "--reason", "TICKET-7: the bank confirms the payment",
		"--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "--seen-version is required: payout "+id.String())
	require.Contains(t, r.stderr, "is MANUAL now (version "+itoa(version)+")")
	var state string
	var after int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT state, version FROM stepwise_operation WHERE operation_id = $1`, id).Scan(&state, &after))
	require.Equal(t, "MANUAL", state, "refused: nothing changed")
	require.Equal(t, version, after, "refused: nothing changed")
	r = runCLI(t, "resolve", id.String(), "--from", "MANUAL", "--seen-version", itoa(version), "--to", "SUCCEEDED", "--reason", "TICKET-7: the bank confirms the payment",
		"--actor", "alice", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)

	// Forty days later (the history made old), the monthly prune.
	_, err = pool.Exec(ctx, `UPDATE stepwise_event SET at = at - interval '40 days'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE stepwise_operation SET finished_at = finished_at - interval '40 days', updated_at = updated_at - interval '40 days'`)
	require.NoError(t, err)
	defer pruneProgressEvery.Store(pruneProgressEvery.Swap(0)) // a line after every batch
	r = runCLI(t, "prune", "--older-than", "720h", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^prune: \d+s so far: the history of \d+ runs, \d+ run events, \d+ operation events, \d+ signals \(\d+ batches, \d+ rows/s\)$`, r.stderr,
		"a long prune says on stderr that it is moving")

	var actor, reason string
	var at time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT actor, detail->>'reason', at FROM stepwise_event
		WHERE subject = $1 AND kind = 'op.transition' AND from_state = 'MANUAL' AND to_state = 'SUCCEEDED'`, subject).Scan(&actor, &reason, &at),
		"nothing shows who marked the payout SUCCEEDED by hand")
	require.Equal(t, "alice", actor)
	require.Equal(t, "TICKET-7: the bank confirms the payment", reason)
	require.Contains(t, r.stdout, "2 operation events", "the dispatcher's machine transitions go")
	require.Contains(t, r.stdout, "every decision a person made")

	// A failed run's history goes only by name; a name that is no failed run is refused.
	r = runCLI(t, "prune", "--older-than", "720h", "--failed-run", "settle/nope", "--database-url", dbURL)
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, `there is no run "settle/nope"`)

	r = runCLI(t, "prune", "--help")
	require.Contains(t, r.stderr, "all people's decisions")
	require.Contains(t, r.stderr, "are kept forever")
	require.Contains(t, r.stderr, "--failed-run")
}
