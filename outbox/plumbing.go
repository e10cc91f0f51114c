package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/ledger"
)

// Package reconcile and the console read ledger rows in their own statements and move
// operations through the Outbox's transitions; they reach these through internal/ledger, so
// that none of it is part of this package's API.
func init() {
	ledger.Install(ledger.Hooks{
		Scan: func(row pgx.Row, extra ...any) (any, error) { return scanOperation(row, extra...) },
		TransitionTx: func(ctx context.Context, ob any, tx pgx.Tx, ms []ledger.Move) (any, error) {
			ts := make([]transition, len(ms))
			for i, m := range ms {
				ts[i] = fromMove(m)
			}
			return ob.(*Outbox).transitionTx(ctx, tx, ts)
		},
		TransitionOneTx: func(ctx context.Context, ob any, tx pgx.Tx, m ledger.Move) (any, error) {
			return ob.(*Outbox).transitionOneTx(ctx, tx, fromMove(m))
		},
		Wake: wake,
	})
}

func fromMove(m ledger.Move) transition {
	return transition{OperationID: m.OperationID, From: State(m.From), To: State(m.To), Checks: m.Checks,
		Actor: m.Actor, ExternalRef: m.ExternalRef, Error: m.Error, Reason: m.Reason, Lookup: m.Lookup,
		NextAt: m.NextAt, Detail: m.Detail}
}
