package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// TestResolveWhoseCallbackFailsIsNotANoSuchOperation: the kind's outcome callback runs in the
// resolve's transaction, so its errors come back through the resolve. A row the callback does
// not find (an error matching stepwisetype.ErrNotFound), or something it found changed
// (stepwisetype.ErrChanged), is the callback's failure: a 500 with a reference and the
// operation left MANUAL. Guards against the console telling the operator "no operation" or
// "the operation moved since you saw it" when neither is true, so that they reload and
// decide again on a page that has not changed.
func TestResolveWhoseCallbackFailsIsNotANoSuchOperation(t *testing.T) {
	t.Parallel()
	for name, cbErr := range map[string]error{
		"not found": fmt.Errorf("the payout's settlement row: %w", stepwisetype.ErrNotFound),
		"changed":   fmt.Errorf("moving the payout's settlement: %w", stepwisetype.ErrChanged),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, nil)
			pcfg := f.pool.Config() // the same database, with room for a client's queues
			pcfg.MaxConns = 20
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			client, err := stepwise.NewClient(pool, &stepwise.Config{Logger: slog.New(slog.DiscardHandler), Kinds: map[string]*stepwise.KindConfig{
				"payout": {
					Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil }),
					OnOutcome: func(context.Context, pgx.Tx, *outbox.Operation, outbox.Outcome) error {
						return cbErr
					},
				},
			}})
			require.NoError(t, err)
			f.cfg.Client = client
			f.h, err = console.New(f.pool, f.cfg)
			require.NoError(t, err)

			f.enqueue(t, "m", "", 1)
			f.setState(t, "m-0", outbox.StateManual, "gave up: 5 checks")
			id := outbox.OperationID("payout", "m-0")
			page := f.get(t, "/console/operation?id="+id.String())
			res := f.post(t, "/console/operation/resolve", url.Values{"csrf": {csrf(t, page)}, "id": {id.String()}, "seen": {"MANUAL"},
				"seen_version": {form(page, "resolve-form").Get("seen_version")}, "outcome": {"SUCCEEDED"},
				"reason": {"TICKET-8: the bank confirms the payment"}})
			require.Equal(t, http.StatusInternalServerError, res.status, res.text)
			require.NotContains(t, res.text, "no operation")
			require.NotContains(t, res.text, "is no longer the MANUAL you saw")

			op, err := outbox.Get(context.Background(), f.pool, id)
			require.NoError(t, err)
			require.Equal(t, outbox.StateManual, op.State, "nothing was resolved")
		})
	}
}
