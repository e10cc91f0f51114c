package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/ledger"
)

// Package reconcile and the console read ledger rows in their own statements and move
// operations through the Outbox's transitions; they reach these through internal/ledger, so
// that none of it is part of this package's API.
//
// A move into RETRYABLE through these (the reconciler's, or a person's resolution) also wakes
// the kind's dispatcher in the move's transaction, with the River client of ctx (a worker's
// context, or ContextWithClient); without one the poll finds the operation. The dispatcher's
// own moves do not: it is running, and sends them again itself.
func init() {
	ledger.Install(ledger.Hooks{
		Scan: func(row pgx.Row, extra ...any) (any, error) { return scanOperation(row, extra...) },
		TransitionTx: func(ctx context.Context, ob any, tx pgx.Tx, ms []ledger.Move) (any, error) {
			ts := make([]transition, len(ms))
			for i, m := range ms {
				ts[i] = fromMove(m)
			}
			out, err := ob.(*Outbox).transitionTx(ctx, tx, ts)
			if err != nil {
				return nil, err
			}
			var retry []string
			for _, oo := range out {
				if oo.Outcome.To == StateRetryable {
					retry = append(retry, oo.Op.Kind)
				}
			}
			if _, err := wake(ctx, tx, retry...); err != nil {
				return nil, err
			}
			return out, nil
		},
		TransitionOneTx: func(ctx context.Context, ob any, tx pgx.Tx, m ledger.Move) (any, error) {
			op, err := ob.(*Outbox).transitionOneTx(ctx, tx, fromMove(m))
			if err != nil {
				return nil, err
			}
			if op.State == StateRetryable {
				if _, err := wake(ctx, tx, op.Kind); err != nil {
					return nil, err
				}
			}
			return op, nil
		},
	})
}

func fromMove(m ledger.Move) transition {
	return transition{OperationID: m.OperationID, From: State(m.From), To: State(m.To), Checks: m.Checks,
		Actor: m.Actor, ExternalRef: m.ExternalRef, Error: m.Error, Reason: m.Reason, Lookup: m.Lookup,
		NextAt: m.NextAt, Detail: m.Detail}
}
