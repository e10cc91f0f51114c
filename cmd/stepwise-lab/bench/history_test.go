package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// A checkpoint that removes WAL between a measure's two LSNs must not fail the history
// section: on a busy server one did, after 40 minutes of seeding and rounds ("requested WAL
// segment ... has already been removed"). The range here starts at the cluster's first WAL
// position, whose segment a server that has run for a while no longer holds.
func TestWALBetweenSurvivesRemovedSegments(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		t.Skipf("no pg_walinspect on the test server: %v", err)
	}
	to, err := walLSN(ctx, pool)
	require.NoError(t, err)
	const first = "0/1000028" // the first record of a new cluster
	var n int
	if pool.QueryRow(ctx, `SELECT count(*)::int FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn)`, first, to).Scan(&n) == nil {
		t.Skip("the test server still holds its first WAL segment: nothing was removed to read around")
	}
	w, err := walBetween(ctx, pool, true, first, to)
	require.NoError(t, err, "a removed WAL segment must cost the measure its full-page images, not the section")
	require.Equal(t, -1.0, w.fpi, "the full-page images of a range whose WAL is gone are unknown")
	require.Greater(t, w.bytes, 0.0, "the bytes still come from the LSNs")
}
