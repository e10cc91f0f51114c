package stepwisetype

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what Stepwise's functions need of a database handle to run statements: a
// *pgxpool.Pool, a *pgxpool.Conn, a *pgx.Conn and a pgx.Tx all satisfy it. Functions that
// write with the caller's business change (outbox.Enqueue, a step's own writes) take the
// pgx.Tx itself instead, so that they cannot be handed a pool by mistake.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
