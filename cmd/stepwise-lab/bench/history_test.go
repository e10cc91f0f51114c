package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/retention"
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

// The prune section runs one pass for all its windows: a quiet window holds the pass between
// two batches, and nothing is deleted while it is held, however the window's end falls on a
// batch or on the pause between two (close waits for the batch under way, and the one after
// the pause, to commit). Every old event goes, in one pass.
func TestPrunePassHoldsBetweenWindows(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `
		WITH ops AS (
			INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state, created_at, updated_at)
			SELECT gen_random_uuid(), 'payout', 'bk-' || i, '{}', '\x00', 'r', 'SUCCEEDED', now() - interval '40 days', now() - interval '40 days'
			  FROM generate_series(1, 3000) i
			RETURNING operation_id, created_at)
		INSERT INTO stepwise_event (subject, kind, to_state, at)
		SELECT 'op:' || operation_id, 'op.transition', 'SUCCEEDED', created_at FROM ops`)
	require.NoError(t, err)
	events := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event`).Scan(&n))
		return n
	}

	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pass := newPrunePass(pctx)
	ended := make(chan struct{})
	var res *retention.Result
	var perr error
	pass.open()
	go func() {
		defer close(ended)
		res, perr = retention.Prune(pctx, pool, &retention.Config{OlderThan: historyAge, BatchSize: 50, Progress: pass.progress})
		pass.end()
	}()
	holds := 0
	for done := false; !done; {
		select {
		case <-ended:
			done = true
		case <-time.After(30 * time.Millisecond):
		}
		got, _ := pass.close()
		if !done {
			left := events()
			time.Sleep(40 * time.Millisecond)
			require.Equal(t, left, events(), "a batch ran while the pass was held (after %d events)", got.OperationEvents)
			require.EqualValues(t, 3000-left, got.OperationEvents, "the totals at the hold are what is deleted")
			holds++
		}
		pass.open()
	}
	require.NoError(t, perr)
	require.EqualValues(t, 3000, res.OperationEvents, "one pass deletes every old event")
	require.Zero(t, events())
	require.Greater(t, holds, 3, "the pass was held between windows")
}

// A window shorter than the pass's wake-up (an open followed at once by a close) must not
// lose the pass: the held report leaves on the opening however short, so the close finds the
// next report.
func TestPrunePassShortOpeningWakesTheHeldPass(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pass := newPrunePass(ctx)
	go func() { // a pass that reports as fast as it can: each report is a batch
		for i := 0; ctx.Err() == nil; i++ {
			pass.progress(retention.Result{Batches: i})
		}
	}()
	done := make(chan int)
	go func() {
		last := -1
		for range 1000 {
			pass.open()
			got, _ := pass.close()
			if got.Batches <= last {
				panic("close returned without a new report")
			}
			last = got.Batches
		}
		done <- last
	}()
	select {
	case last := <-done:
		require.GreaterOrEqual(t, last, 999)
	case <-time.After(20 * time.Second):
		t.Fatal("a close after a short opening waits for a report the held pass never makes")
	}
}
