// Package pgtx holds the transaction helpers the SDK's packages share.
package pgtx

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// RollbackTimeout bounds Rollback.
const RollbackTimeout = 5 * time.Second

// Rollback ends tx on a context that is not cancelled, like River's RollbackWithoutCancel: a
// transaction left open on a pooled connection would hold its locks until the server's idle
// timeout. It is for deferred clean-up, so its error is dropped; after a commit it is a no-op.
func Rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}
