package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestEnqueueInsertsPendingRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	registerPayout(t, pool)

	op := payout("settle/2026-03-01/m-1", "acct-1", 1250)
	op.RunKey = "settle/2026-03-01/0"
	var res *outbox.EnqueueResult
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = outbox.Enqueue(ctx, tx, op, payout("settle/2026-03-01/m-2", "acct-2", 99))
		return err
	}))
	require.Equal(t, 2, res.Inserted)
	require.Empty(t, res.Existing)
	require.False(t, res.Woken, "no River client in the context: the poll finds them")

	got := get(t, pool, outbox.OperationID("payout", "settle/2026-03-01/m-1"))
	require.Equal(t, outbox.StatePending, got.State)
	require.Equal(t, "payout", got.Kind)
	require.Equal(t, int64(1250), got.Amount)
	require.Equal(t, "EUR", got.Currency)
	require.Equal(t, "settle/2026-03-01/0", got.RunKey)
	require.JSONEq(t, `{"account":"acct-1"}`, string(got.Payload))
	require.Zero(t, got.Attempts)
	require.Len(t, got.PayloadHash, 32)

	n, err := outbox.UnfinishedForRuns(ctx, pool, "settle/2026-03-01/0")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func TestEnqueueSameOperationAgainIsNoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	registerPayout(t, pool)

	first := payout("k-1", "acct-1", 500)
	enqueue(t, pool, first)

	// A step that runs again after a crash enqueues the same operation again; JSON spelled
	// differently is still the same payload.
	again := first
	again.Payload = json.RawMessage(`{ "account" :  "acct-1" }`)
	var res *outbox.EnqueueResult
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = outbox.Enqueue(ctx, tx, again, payout("k-2", "acct-2", 1))
		return err
	}))
	require.Equal(t, 1, res.Inserted)
	require.Len(t, res.Existing, 1)
	require.Equal(t, outbox.OperationID("payout", "k-1"), res.Existing[0].ID)
	require.Equal(t, outbox.StatePending, res.Existing[0].State)
	require.Equal(t, map[outbox.State]int64{outbox.StatePending: 2}, stateCounts(t, pool))
}

func TestEnqueueConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	registerPayout(t, pool)

	first := payout("settle/m-7", "acct-7", 1000)
	enqueue(t, pool, first)
	before := get(t, pool, outbox.OperationID("payout", "settle/m-7"))

	cases := []struct {
		name string
		op   outbox.EnqueueParams
	}{
		{"same business key, different amount", payout("settle/m-7", "acct-7", 1001)},
		{"same business key, different payload", payout("settle/m-7", "acct-8", 1000)},
		{"same business key, different currency", func() outbox.EnqueueParams {
			op := payout("settle/m-7", "acct-7", 1000)
			op.Currency = "USD"
			return op
		}()},
		{"same id, different business key", func() outbox.EnqueueParams {
			op := payout("settle/m-other", "acct-7", 1000)
			op.ID = before.ID
			return op
		}()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fresh := payout("unrelated-"+strings.ReplaceAll(tc.name, " ", "-"), "acct-9", 5)
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, fresh, tc.op)
				require.ErrorIs(t, err, outbox.ErrOperationConflict)
				var ce *outbox.ConflictError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, before.ID, ce.Existing.ID)
				require.Equal(t, int64(1000), ce.Existing.Amount)
				require.Equal(t, tc.op.Amount, ce.New.Amount)
				require.Contains(t, err.Error(), before.ID.String())
				require.Contains(t, err.Error(), "settle/m-7")

				// No row of the failed call is left in the caller's transaction, and the
				// transaction is still usable.
				var n int
				require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation WHERE business_key = $1`, fresh.BusinessKey).Scan(&n))
				require.Zero(t, n)
				return nil
			})
			require.NoError(t, err)
			after := get(t, pool, before.ID)
			require.Equal(t, before, after, "the first row is unchanged")
		})
	}

	t.Run("within one call", func(t *testing.T) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, payout("dup", "a", 1), payout("dup", "a", 2))
			return err
		})
		require.ErrorIs(t, err, outbox.ErrOperationConflict)
		_, err = outbox.Get(ctx, pool, outbox.OperationID("payout", "dup"))
		require.ErrorIs(t, err, outbox.ErrNotFound)
	})
}

func TestEnqueueRejectsBeforeTouchingTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)

	big := payout("big", "acct", 1)
	big.Payload = json.RawMessage(`{"blob":"` + strings.Repeat("x", outbox.MaxPayloadBytes) + `"}`)

	cases := []struct {
		name string
		op   outbox.EnqueueParams
		want error
	}{
		{"payload over the limit", big, outbox.ErrPayloadTooLarge},
		{"payload not JSON", outbox.EnqueueParams{Kind: "payout", BusinessKey: "k", Payload: json.RawMessage(`{`)}, outbox.ErrInvalidOperation},
		{"kind with capitals", outbox.EnqueueParams{Kind: "Payout", BusinessKey: "k"}, outbox.ErrInvalidOperation},
		{"kind too long", outbox.EnqueueParams{Kind: strings.Repeat("k", outbox.MaxKindLen+1), BusinessKey: "k"}, outbox.ErrInvalidOperation},
		{"empty business key", outbox.EnqueueParams{Kind: "payout"}, outbox.ErrInvalidOperation},
		{"bad currency", outbox.EnqueueParams{Kind: "payout", BusinessKey: "k", Amount: 1, Currency: "eur"}, outbox.ErrInvalidOperation},
		{"amount without currency", outbox.EnqueueParams{Kind: "payout", BusinessKey: "k", Amount: 1}, outbox.ErrInvalidOperation},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, payout("good", "acct", 1), tc.op)
				require.ErrorIs(t, err, tc.want)
				// The caller's transaction is untouched: no statement ran, none failed.
				var n int
				require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation`).Scan(&n))
				require.Zero(t, n)
				return nil
			})
			require.NoError(t, err)
		})
	}
}

// TestStepThatFailsLeavesNothing is the first acceptance item: a step that enqueues
// operations and then fails leaves neither its business rows nor its operations.
func TestStepThatFailsLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	registerPayout(t, pool)
	_, err := pool.Exec(ctx, `CREATE TABLE settlement (merchant text PRIMARY KEY, amount bigint NOT NULL, status text NOT NULL)`)
	require.NoError(t, err)

	stepErr := errors.New("step failed after enqueueing")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var ops []outbox.EnqueueParams
		for i := range 50 {
			m := fmt.Sprintf("m-%d", i)
			if _, err := tx.Exec(ctx, `INSERT INTO settlement VALUES ($1, $2, 'SETTLED')`, m, 100+i); err != nil {
				return err
			}
			ops = append(ops, payout("settle/"+m, m, int64(100+i)))
		}
		if _, err := outbox.Enqueue(ctx, tx, ops...); err != nil {
			return err
		}
		return stepErr
	})
	require.ErrorIs(t, err, stepErr)

	var settlements, operations int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM settlement`).Scan(&settlements))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation`).Scan(&operations))
	require.Zero(t, settlements)
	require.Zero(t, operations)
}

func TestEnqueueManyIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	registerPayout(t, pool)

	ops := make([]outbox.EnqueueParams, 5000)
	for i := range ops {
		ops[i] = payout(fmt.Sprintf("k-%d", i), "acct", int64(i+1))
	}
	enqueue(t, pool, ops...)
	require.Equal(t, map[outbox.State]int64{outbox.StatePending: 5000}, stateCounts(t, pool))

	// Replaying the whole batch is a no-op, found through the unique indexes.
	var res *outbox.EnqueueResult
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = outbox.Enqueue(ctx, tx, ops...)
		return err
	}))
	require.Zero(t, res.Inserted)
	require.Len(t, res.Existing, 5000)
}

func TestOperationIDIsStable(t *testing.T) {
	t.Parallel()
	// Pinned: a changed derivation would give every operation a new idempotency key, and an
	// external system would apply a resent operation twice.
	id := outbox.OperationID("payout", "settle/2026-03-01/m-42")
	require.Equal(t, uuid.Version(5), id.Version())
	require.Equal(t, "b837c6b3-f45d-5f5a-a4c0-9305bb56fe22", id.String())
	require.NotEqual(t, id, outbox.OperationID("refund", "settle/2026-03-01/m-42"))
}
