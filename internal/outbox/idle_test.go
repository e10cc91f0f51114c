package outbox_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/faultpoint"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// TestIdleDispatcherStalledBeforeCompletingSeesWorkCommittedMeanwhile: a dispatcher that found
// nothing to claim begins the transaction that completes its job, and stalls there (a slow
// round trip, a GC pause; here the dispatcher-idle fault point). An operation committed during
// the stall has its wake swallowed by the still-running job, so the job's check for due work
// must count it. When the check compared next_attempt_at with now() — the start of the
// stalled transaction — the operation was seen but judged not yet due, the job completed, and
// the operation waited for the poll (an hour here; 4.3 s in the review with the default
// poll). Not parallel: the fault point is armed for the whole process.
func TestIdleDispatcherStalledBeforeCompletingSeesWorkCommittedMeanwhile(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	var sent atomic.Int64
	ob, err := outbox.New(pool, &outbox.Config{
		Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			sent.Add(1)
			return outbox.Receipt{ExternalRef: "ok"}, nil
		}), Timeout: 2 * time.Second}},
		PollInterval: time.Hour, // only the poll at start: delivery must come from the wake
	})
	require.NoError(t, err)
	require.NoError(t, ob.Register(ctx))
	rc := startClient(t, pool, ob, river.NewWorkers())

	const stall = 1500 * time.Millisecond
	require.NoError(t, faultpoint.Configure(faultpoint.DispatcherIdle+":pause="+stall.String(), "1"))
	t.Cleanup(func() { _ = faultpoint.Configure("", "") })

	wakeEnqueue := func(key string) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ob.Local().Context(ctx, rc), tx, payout(key, "acct", 100))
			return err
		}))
	}
	wakeEnqueue("idle/first")
	waitForState(t, pool, outbox.StateSucceeded, 1, 15*time.Second)

	// Wait until the dispatcher's completing transaction is open and stalled, so that the
	// second operation commits inside the stall (not before the dispatcher's last claim).
	deadline := time.Now().Add(10 * time.Second)
	for {
		var stalled bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'
			  AND xact_start < now() - interval '100 milliseconds')`).Scan(&stalled))
		if stalled {
			break
		}
		require.True(t, time.Now().Before(deadline), "the dispatcher never stalled in its completing transaction")
		time.Sleep(10 * time.Millisecond)
	}
	enqueuedAt := time.Now()
	wakeEnqueue("idle/second")
	waitForState(t, pool, outbox.StateSucceeded, 2, stall+5*time.Second)
	t.Logf("operation committed during a %s stall delivered %s after its commit", stall, time.Since(enqueuedAt).Round(time.Millisecond))
	require.EqualValues(t, 2, sent.Load())
}
