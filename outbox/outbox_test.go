package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/outbox"
)

// A program that enqueues before any client with the kind has started (a web tier deployed
// first, a migration) registers the kind itself, through the public package only, on a
// database it migrated itself.
func TestRegisterKindsLetsEnqueueAcceptAKindNoClientStarted(t *testing.T) {
	ctx := context.Background()
	pool := testkit.EmptyDB(t)
	require.NoError(t, migrations.Migrate(ctx, pool))

	enqueue := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.EnqueueParams{Kind: "refund", BusinessKey: "r-1",
				Payload: json.RawMessage(`{"order": 1}`), Amount: 250, Currency: "EUR"})
			return err
		})
	}
	err := enqueue()
	require.ErrorIs(t, err, outbox.ErrUnknownKind, "a kind nobody registered would wait forever")
	require.ErrorContains(t, err, "outbox.RegisterKinds", "the error names the fix a program without a client can apply")

	require.NoError(t, outbox.RegisterKinds(ctx, pool, "web-tier", "refund"))
	require.NoError(t, outbox.RegisterKinds(ctx, pool, "web-tier", "refund"), "registering again is a no-op")
	require.NoError(t, enqueue())

	var by string
	require.NoError(t, pool.QueryRow(ctx, `SELECT registered_by FROM stepwise_outbox_kind WHERE kind = 'refund'`).Scan(&by))
	require.Equal(t, "web-tier", by)

	err = outbox.RegisterKinds(ctx, pool, "web-tier", "Refund Kind")
	require.ErrorIs(t, err, outbox.ErrInvalidOperation)
	require.ErrorContains(t, err, `kind "Refund Kind"`)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_outbox_kind`).Scan(&n))
	require.Equal(t, 1, n, "a bad kind registers nothing")
}

// The public package's classification is the dispatcher's.
func TestClassifyThroughThePublicPackage(t *testing.T) {
	require.Equal(t, outbox.StateSucceeded, outbox.Classify(nil))
	require.Equal(t, outbox.StateFailedPermanent, outbox.Classify(outbox.Permanent(errors.New("declined"))))
	require.Equal(t, outbox.StateRetryable, outbox.Classify(outbox.NotSent(errors.New("no connection"))))
	require.Equal(t, outbox.StateUnknownExternal, outbox.Classify(errors.New("timeout")))
	require.True(t, outbox.IsNotSent(outbox.NotSent(errors.New("x"))))
	require.False(t, outbox.IsPermanent(outbox.NotSent(errors.New("x"))))
}
