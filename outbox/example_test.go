package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/outbox"
)

// bankAPI stands for a payment provider's client.
type bankAPI interface {
	Pay(ctx context.Context, idempotencyKey string, amount int64, currency string) (ref string, err error)
}

var errDeclined = errors.New("declined")

// A Sender classifies each answer honestly: a refusal is Permanent, a request that provably
// never left is NotSent (resent later under the same id), and anything else, a timeout
// included, becomes UNKNOWN_EXTERNAL for the reconciler to settle by asking the bank.
func ExampleSendFunc() {
	var bank bankAPI // your provider's client
	sender := outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
		ref, err := bank.Pay(ctx, op.IdempotencyKey(), op.Amount, op.Currency)
		var dial *net.OpError
		switch {
		case err == nil:
			return outbox.Receipt{ExternalRef: ref}, nil
		case errors.Is(err, errDeclined):
			return outbox.Receipt{}, outbox.Permanent(err)
		case errors.As(err, &dial) && dial.Op == "dial":
			return outbox.Receipt{}, outbox.NotSent(err) // no connection: nothing reached the bank
		default:
			return outbox.Receipt{}, err // it may have paid: UNKNOWN_EXTERNAL
		}
	})
	_ = sender // stepwise.KindConfig{Sender: sender, Checker: ...}
}

// Enqueue runs in the transaction of the business change that causes the payouts (a step's
// s.Tx), so they commit or vanish with it. Enqueueing the same payouts again, from a step
// that ran twice, is a no-op.
func ExampleEnqueue() {
	enqueue := func(ctx context.Context, tx pgx.Tx, date string, merchants map[string]int64) error {
		ops := make([]outbox.EnqueueParams, 0, len(merchants))
		for m, amount := range merchants {
			ops = append(ops, outbox.EnqueueParams{
				Kind:        "payout",
				BusinessKey: fmt.Sprintf("settle/%s/%s", date, m), // the operation id derives from it
				Payload:     []byte(fmt.Sprintf(`{"merchant": %q}`, m)),
				Amount:      amount, // minor units
				Currency:    "EUR",
			})
		}
		_, err := outbox.Enqueue(ctx, tx, ops...)
		return err
	}
	_ = enqueue
}
