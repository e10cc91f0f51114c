package pgserver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A throwaway cluster stopped as a crash would (immediate) and started again keeps every
// commit it acknowledged (synchronous_commit on), loses the open transaction, and answers on
// the same port, or on another one for a failover-like address change.
func TestThrowawayCrashAndStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := Throwaway(ctx, &ThrowawayOptions{Logf: t.Logf})
	if errors.Is(err, ErrNoBinaries) {
		t.Skipf("no PostgreSQL binaries (initdb, pg_ctl, postgres) on this machine: %v", err)
	}
	require.NoError(t, err)
	defer srv.Close()

	conn, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 1000)`)
	require.NoError(t, err)
	open, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	_, err = open.Exec(ctx, `BEGIN; INSERT INTO t VALUES (-1)`)
	require.NoError(t, err)
	port := srv.Port()

	require.NoError(t, srv.StopImmediate(ctx))
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "a connection to a stopped server must fail")
	require.NoError(t, srv.Start(ctx, 0))
	require.Equal(t, port, srv.Port(), "started again on the port it had")
	require.Equal(t, 1000, count(ctx, t, srv.URL), "an acknowledged commit was lost, or the open transaction landed")

	// Failover-like: the server comes back on another address.
	require.NoError(t, srv.StopImmediate(ctx))
	other, err := freePort()
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx, other))
	require.Equal(t, other, srv.Port())
	require.Equal(t, 1000, count(ctx, t, srv.URL))
	require.Error(t, srv.Start(ctx, 0), "starting a running cluster must be refused")
}

func count(ctx context.Context, t *testing.T, url string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
	return n
}
