package stepwisetype_test

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Every handle a user holds must satisfy DBTX; this fails to compile otherwise.
var (
	_ stepwisetype.DBTX = (*pgxpool.Pool)(nil)
	_ stepwisetype.DBTX = (*pgxpool.Conn)(nil)
	_ stepwisetype.DBTX = (*pgx.Conn)(nil)
	_ stepwisetype.DBTX = pgx.Tx(nil)
)
