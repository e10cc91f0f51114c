package quickstart

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// Schema is the business tables the quick start's step writes.
const Schema = `
	CREATE TABLE IF NOT EXISTS merchant (id bigint PRIMARY KEY);
	CREATE TABLE IF NOT EXISTS settlement (merchant_id bigint, settle_date date, PRIMARY KEY (merchant_id, settle_date));`

// Run is the README's run.
func Run(ctx context.Context, pool *pgxpool.Pool, bank Bank) error { return run(ctx, pool, bank) }

// Bank is the quick start's adapter to the external system: it pays under the operation_id
// and looks a payment up by it (workflowtest/fakebank's Sender and Checker show the pattern).
// Over HTTP, send through outbox/httpsend: net/http alone resends a POST carrying an
// Idempotency-Key by itself, and its "connection refused" can follow a payment the bank made.
type Bank interface {
	outbox.Sender
	reconcile.Checker
}

// FakeBank is the fake bank's client as the README's Bank: its Sender pays, its Checker
// looks up.
type FakeBank struct {
	fakebank.Sender
	fakebank.Checker
}

// NewFakeBank returns a Bank that talks to the fake bank at url.
func NewFakeBank(url string) FakeBank {
	c := fakebank.NewClient(url, nil)
	return FakeBank{Sender: fakebank.Sender{Client: c}, Checker: fakebank.Checker{Client: c}}
}

// settleBatch settles the next limit merchants after the cursor in one statement and
// returns their ids.
func settleBatch(ctx context.Context, tx pgx.Tx, date string, after int64, limit int) ([]int64, error) {
	rows, err := tx.Query(ctx, `
		WITH batch AS (
			SELECT id FROM merchant WHERE id > $2 ORDER BY id LIMIT $3
		), settled AS (
			INSERT INTO settlement (merchant_id, settle_date)
			SELECT id, $1::date FROM batch
			ON CONFLICT DO NOTHING
		)
		SELECT id FROM batch ORDER BY id`, date, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// payouts is one payout per merchant, keyed by date and merchant.
func payouts(date string, ids []int64) []outbox.EnqueueParams {
	out := make([]outbox.EnqueueParams, len(ids))
	for i, id := range ids {
		payload, _ := json.Marshal(fakebank.Payload{Account: fmt.Sprintf("ACCT-%d", id)})
		out[i] = outbox.EnqueueParams{
			Kind:        "payout",
			BusinessKey: fmt.Sprintf("%s/%d", date, id),
			Payload:     payload,
			Amount:      100, Currency: "EUR",
		}
	}
	return out
}
