package stepwise

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/outbox"
)

// NewOperatorClient returns a Client for operator tools that do none of the service's work
// (the stepwise command, a standalone console): it reads and acts through pool with an
// insert-only River client (a resumed run's job is inserted for the service's own workers).
// It knows only noCallbackKinds, operation kinds the operator says have no outcome callback
// (OnOutcome, OnOutcomeBatch): OperationResolve resolves their operations, and refuses
// any other kind unless OperationResolveOpts.NoCallback says so. A service uses NewClient,
// whose client has its kinds and runs their callbacks.
func NewOperatorClient(pool *pgxpool.Pool, noCallbackKinds ...string) (*Client, error) {
	if pool == nil {
		return nil, errors.New("stepwise.NewOperatorClient: pool is nil")
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return nil, fmt.Errorf("stepwise.NewOperatorClient: %w", err)
	}
	c := &Client{pool: pool, river: rc, wakes: rc, local: outbox.NewLocal()}
	if len(noCallbackKinds) > 0 {
		if c.outbox, c.resolver, err = noCallbackResolver(pool, noCallbackKinds...); err != nil {
			return nil, fmt.Errorf("stepwise.NewOperatorClient: noCallbackKinds: %w", err)
		}
	}
	return c, nil
}
