// Package pgtx holds the transaction helpers the SDK's packages share.
package pgtx

import (
	"context"
	"time"

	"github.com/google/uuid"
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

// UUIDs returns ids as a uuid[] parameter that pgx encodes natively. Guards against: uuid.UUID
// implements driver.Valuer, so pgx encodes a []uuid.UUID element by element through each id's
// text form, planning every element anew. Measured with 100 ids, an array encoded and read
// back took 229 µs and 2,523 allocations that way, 107 µs and 423 allocations as [16]byte
// (and, for the ids read back, scanned into *[16]byte: see UUIDDest).
func UUIDs(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// UUIDDest is a scan destination for a non-null uuid column into id, decoded from the binary
// form without the text round trip that scanning into *uuid.UUID (an sql.Scanner) takes.
func UUIDDest(id *uuid.UUID) *[16]byte { return (*[16]byte)(id) }
