package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// drillKind is the delivery configuration shared by the drill's child and parent: a short
// lease, so that the test waits seconds, not minutes, for crash recovery.
func drillKind(client *fakebank.Client) *outbox.KindConfig {
	return &outbox.KindConfig{
		Sender:      bankSender{Client: client},
		BatchSize:   1,
		Concurrency: 1,
		Timeout:     500 * time.Millisecond,
		Lease:       2 * time.Second,
	}
}

func init() {
	// A delivery worker: a River client running the outbox against the bank at BANK_URL.
	// The parent starts it with STEPWISE_FAULTS set, to kill it at a fault point.
	workflowtest.RegisterRole("outbox-worker", func(ctx context.Context, env map[string]string) error {
		return testkit.RiverChild(ctx, env, func(pool *pgxpool.Pool, cfg *river.Config) error {
			ob, err := outbox.New(pool, &outbox.Config{
				ID:    "child",
				Kinds: map[string]*outbox.KindConfig{"payout": drillKind(fakebank.NewClient(env["BANK_URL"], nil))},
			})
			if err != nil {
				return err
			}
			if err := ob.Install(cfg); err != nil {
				return err
			}
			return ob.Register(context.Background())
		})
	})
}

// TestDrillKillAfterSend is fault drill 2: a delivery worker is kill -9'ed after the bank
// applied the payment and before the outcome was recorded. The operation must end
// UNKNOWN_EXTERNAL once its lease expires, and must never be sent again blindly.
func TestDrillKillAfterSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testkit.DBURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	registerPayout(t, pool)
	bank, client := startBank(t, nil, 5*time.Second, true)

	op := payout("settle/drill-2/m-1", "acct-1", 4200)
	enqueue(t, pool, op)
	id := outbox.OperationID("payout", op.BusinessKey)

	child := workflowtest.Start(t, "outbox-worker",
		"DATABASE_URL="+dbURL, "BANK_URL="+bank.URL(), "STEPWISE_FAULTS=after-send:kill")
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = child.WaitForLine(waitCtx, "stepwise-fault: after-send:kill")
	require.NoError(t, err)
	err = child.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "the child was killed: %v", err)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())

	// The bank applied it; the ledger does not know.
	require.Equal(t, 1, bank.Effects(id.String()))
	require.Equal(t, outbox.StateProcessing, get(t, pool, id).State)

	// A surviving worker takes over: River still calls the dead dispatcher running, so this
	// also proves the takeover. Nothing may be sent until the lease proves the sender dead,
	// and then nothing is sent at all: the operation is UNKNOWN_EXTERNAL.
	ob, err := outbox.New(pool, &outbox.Config{ID: "survivor", Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": drillKind(client)}})
	require.NoError(t, err)
	startClient(t, pool, ob, river.NewWorkers())
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, _ := pool.Query(ctx, `SELECT id::text || ' ' || kind || ' ' || state || ' ' || queue || ' ' || args::text || ' ' || coalesce(attempted_by::text, '') FROM river_job ORDER BY id`)
		js, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, j := range js {
			t.Log(j)
		}
		rows, _ = pool.Query(ctx, `SELECT kind || ' ' || owner || ' ' || (now() - heartbeat_at)::text FROM stepwise_outbox_dispatcher`)
		js, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		t.Log(js)
		rows, _ = pool.Query(ctx, `SELECT leader_id || ' ' || (expires_at - now())::text FROM river_leader`)
		js, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		t.Log(js)
	})
	waitForState(t, pool, outbox.StateUnknownExternal, 1, 30*time.Second)

	got := get(t, pool, id)
	require.Contains(t, got.LastError, "lease of outbox/child#")
	require.Equal(t, 1, got.Attempts, "never resent")
	require.Equal(t, 1, bank.Stats().Requests, "the bank saw one request")
	require.Equal(t, 1, bank.Effects(id.String()))
	require.Equal(t, []string{"PENDING>PROCESSING", "PROCESSING>UNKNOWN_EXTERNAL"}, events(t, pool, id))

	// And it stays so: later dispatcher passes leave it to the reconciler.
	_, err = ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, 1, bank.Stats().Requests)
	require.Nil(t, get(t, pool, id).LeaseUntil)
}
