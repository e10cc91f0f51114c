package stepwise

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// NewOperatorClient returns a Client for operator tools that do none of the service's work
// (the stepwise command, a standalone console): it reads and acts through pool with an
// insert-only River client (a resumed run's job is inserted for the service's own workers),
// and knows no operation kinds, so OperationResolve refuses unless NoCallback says the
// kind has no outcome callback. A service uses NewClient, whose client has its kinds.
func NewOperatorClient(pool *pgxpool.Pool) (*Client, error) {
	if pool == nil {
		return nil, errors.New("stepwise.NewOperatorClient: pool is nil")
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return nil, fmt.Errorf("stepwise.NewOperatorClient: %w", err)
	}
	return &Client{pool: pool, river: rc}, nil
}
