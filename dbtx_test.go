package stepwise_test

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise"
)

// Every handle a user holds must satisfy DBTX; this fails to compile otherwise.
var (
	_ stepwise.DBTX = (*pgxpool.Pool)(nil)
	_ stepwise.DBTX = (*pgxpool.Conn)(nil)
	_ stepwise.DBTX = (*pgx.Conn)(nil)
	_ stepwise.DBTX = pgx.Tx(nil)
)
