package quickstart_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/quickstart"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

func init() {
	// The README's main: a pool, a context that SIGTERM ends, and run.
	workflowtest.RegisterRole("quickstart", func(ctx context.Context, env map[string]string) error {
		pool, err := pgxpool.New(context.Background(), env["DATABASE_URL"])
		if err != nil {
			return err
		}
		defer pool.Close()
		return quickstart.Run(ctx, pool, quickstart.NewFakeBank(env["BANK_URL"]))
	})
}

// A process wired exactly as the README wires it gets SIGTERM while the bank is slow and
// payouts are in flight. It must drain: exit cleanly, every send in flight answered and
// recorded (none cut to UNKNOWN_EXTERNAL), every lease released. Guards against: a quick
// start whose shutdown is River's hard stop (Start's context cancelled by the signal), which
// cancels the bank calls in flight — each becomes UNKNOWN_EXTERNAL and waits for the
// reconciler — and leaves leases to lapse.
func TestQuickStartDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testkit.EmptyDBURL(t) // a database nobody migrated: run migrates it
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, quickstart.Schema+`INSERT INTO merchant SELECT generate_series(1, 3000);`)
	require.NoError(t, err)

	// A bank that takes 300 ms per payment and never deduplicates.
	bank := fakebank.New(&fakebank.Config{Strict: true, Latency: 300 * time.Millisecond})
	require.NoError(t, bank.Start())
	defer bank.Close() //nolint:errcheck

	// The README's main sizes the pool in its URL, as the error of a pool too small says:
	// pgxpool's default (max(4, NumCPU)) cannot hold the quick start's River workers.
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	p := workflowtest.Start(t, "quickstart", "DATABASE_URL="+dbURL+sep+"pool_max_conns=30", "BANK_URL="+bank.URL())
	// Wait until the bank holds payments it has not answered yet, then SIGTERM.
	inFlight := 0
	require.Eventually(t, func() bool {
		inFlight = 0
		for _, r := range bank.Requests() {
			if r.Ended().IsZero() {
				inFlight++
			}
		}
		return inFlight > 0
	}, 2*time.Minute, 5*time.Millisecond)
	sent := time.Now()
	require.NoError(t, p.Signal(syscall.SIGTERM))
	require.NoError(t, p.Wait(), "the quick start must exit cleanly on SIGTERM")
	t.Logf("drained in %s with %d payments in flight at SIGTERM", time.Since(sent).Round(time.Millisecond), inFlight)
	require.Positive(t, inFlight, "the test must send SIGTERM with payments in flight")

	var cut, midSend, held, total, succeeded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM stepwise_event WHERE kind = 'op.transition' AND to_state = 'UNKNOWN_EXTERNAL'),
		(SELECT count(*) FROM stepwise_operation WHERE state = 'PROCESSING'),
		(SELECT count(*) FROM stepwise_checkpoint WHERE owner IS NOT NULL AND lease_until > now()),
		(SELECT count(*) FROM stepwise_operation),
		(SELECT count(*) FROM stepwise_operation WHERE state = 'SUCCEEDED')`).Scan(&cut, &midSend, &held, &total, &succeeded))
	t.Logf("after the drain: %d payouts, %d succeeded, %d cut to UNKNOWN_EXTERNAL, %d left mid-send, %d leases held", total, succeeded, cut, midSend, held)
	require.Zero(t, cut, "sends in flight at SIGTERM must be answered, not cut to UNKNOWN_EXTERNAL")
	// A send left PROCESSING by a process that exited is one whose answer nobody recorded:
	// it becomes UNKNOWN_EXTERNAL when its lease lapses.
	require.Zero(t, midSend, "sends in flight at SIGTERM must have their answers recorded")
	require.Zero(t, held, "every lease must be released")
	for _, r := range bank.Requests() {
		require.True(t, r.Abandoned.IsZero(), fmt.Sprintf("request %d for %s was abandoned by the caller", r.Seq, r.OperationID))
	}
}
