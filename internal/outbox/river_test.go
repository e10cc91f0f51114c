package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// settleArgs is a test step: one River job that writes ops operations in its transaction.
type settleArgs struct {
	Batch int `json:"batch"`
	Ops   int `json:"ops"`
}

func (settleArgs) Kind() string { return "test_settle" }

type settleWorker struct {
	river.WorkerDefaults[settleArgs]
	pool  *pgxpool.Pool
	woken chan bool
}

func (w *settleWorker) Work(ctx context.Context, job *river.Job[settleArgs]) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		ops := make([]outbox.EnqueueParams, job.Args.Ops)
		for i := range ops {
			ops[i] = payout(fmt.Sprintf("b%d/m%d", job.Args.Batch, i), "acct", int64(i+1))
		}
		res, err := outbox.Enqueue(ctx, tx, ops...)
		if err != nil {
			return err
		}
		w.woken <- res.Woken
		_, err = river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// startClient starts a River client with the outbox installed, stopped at cleanup.
func startClient(t *testing.T, pool *pgxpool.Pool, ob *outbox.Outbox, workers *river.Workers) *river.Client[pgx.Tx] {
	t.Helper()
	cfg := &river.Config{
		Logger:            slog.New(slog.DiscardHandler),
		Workers:           workers,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 100 * time.Millisecond,
		TestOnly:          true,
	}
	require.NoError(t, ob.Install(cfg))
	require.NoError(t, ob.Register(context.Background()))
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(ctx))
	})
	return client
}

// waitForState waits until n operations are in state, or fails after timeout.
func waitForState(t *testing.T, pool *pgxpool.Pool, state outbox.State, n int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		counts := stateCounts(t, pool)
		if counts[state] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: want %d operations %s, have %v", timeout, n, state, counts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRiverDeliveryWakesWithoutPolling: steps running as River jobs enqueue operations while
// the dispatcher is busy delivering earlier ones. With the poll effectively off, every
// operation must still be delivered: a wake that arrives while the dispatcher runs is never
// lost.
func TestRiverDeliveryWakesWithoutPolling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	bank, client := startBank(t, &fakebank.Config{Latency: time.Millisecond}, 5*time.Second, true)
	kc := &outbox.KindConfig{Sender: bankSender{Client: client}, Timeout: 2 * time.Second, BatchSize: 20, Concurrency: 4}
	ob, err := outbox.New(pool, &outbox.Config{
		Logger: slog.New(slog.DiscardHandler), Kinds: map[string]*outbox.KindConfig{"payout": kc},
		PollInterval: time.Hour, // only the poll at start; the rest must come from wakes
	})
	require.NoError(t, err)
	workers := river.NewWorkers()
	woken := make(chan bool, 1000)
	river.AddWorker(workers, &settleWorker{pool: pool, woken: woken})
	rc := startClient(t, pool, ob, workers)

	// Steps arrive in bursts and trickles, so the dispatcher goes idle (and completes) again
	// and again while steps are enqueueing: the window in which a wake is swallowed.
	const batches, perBatch = 150, 4
	for b := range batches {
		_, err := rc.Insert(ctx, settleArgs{Batch: b, Ops: perBatch}, nil)
		require.NoError(t, err)
		time.Sleep(time.Duration(b%7) * 3 * time.Millisecond)
	}
	for range batches {
		require.True(t, <-woken, "Enqueue inside a River worker queues a dispatcher wake")
	}
	waitForState(t, pool, outbox.StateSucceeded, batches*perBatch, 60*time.Second)
	require.Empty(t, bank.DuplicateReferences())
	require.Equal(t, batches*perBatch, len(bank.Applied()))
}

// TestRiverPollFindsOperationsEnqueuedOutsideAWorker: no client in the context, no wake; the
// periodic poll finds them.
func TestRiverPollFindsOperationsEnqueuedOutsideAWorker(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	ob := newOutbox(t, pool, &scriptSender{}, nil)
	startClient(t, pool, ob, river.NewWorkers())
	time.Sleep(100 * time.Millisecond) // let the first (on start) poll pass, so the next one finds it
	enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: "ok"})
	waitForState(t, pool, outbox.StateSucceeded, 1, 10*time.Second)
}

// TestRiverTakeoverOfADeadDispatcher: a dispatcher killed mid-slice stays "running" in River
// until River's rescuer runs (an hour by default), and its uniqueness swallows every wake.
// The poll sees no heartbeat and starts a takeover dispatcher.
func TestRiverTakeoverOfADeadDispatcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	ob := newOutbox(t, pool, &scriptSender{}, nil)

	// The corpse: a dispatcher job River believes is running, with no heartbeat.
	insertOnly, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	dead, err := insertOnly.Insert(ctx, outbox.DispatchArgsForTest{OperationKind: "payout"}, nil)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '1 minute' WHERE id = $1`, dead.Job.ID)
	require.NoError(t, err)

	rc := startClient(t, pool, ob, river.NewWorkers())
	var res *outbox.EnqueueResult
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err = outbox.Enqueue(ob.Local().Context(ctx, rc), tx, outbox.EnqueueParams{Kind: "payout", BusinessKey: "ok"})
		return err
	}))
	require.True(t, res.Woken)
	waitForState(t, pool, outbox.StateSucceeded, 1, 15*time.Second)

	var takeovers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_outbox_dispatch' AND (args->>'takeover')::bigint = $1`, dead.Job.ID).Scan(&takeovers))
	requireTakeovers(t, takeovers, "a takeover named after the dead dispatcher")
}

// requireTakeovers checks the takeovers named after one dead job: at least one, or the kind
// waits for River's rescue hour; at most two. The enqueue's wake and the poll each name one
// when they find the corpse, and River's uniqueness folds the second into the first only while
// the first is queued or running: under load the first can deliver and complete before the
// poll comes, and the second then runs, finds nothing due and completes (claims keep two
// dispatchers from sending one operation twice). More would be a takeover storm.
func requireTakeovers(t *testing.T, n int, what string) {
	t.Helper()
	require.GreaterOrEqual(t, n, 1, what)
	require.LessOrEqual(t, n, 2, what)
}

// TestRiverTakeoverOfADeadTakeover: the takeover dispatcher can be killed too. Its own
// "running" job then swallows the takeover named after the first corpse; the poll must follow
// the chain and name a new takeover after the newest dead job, or the kind stays without a
// dispatcher for River's rescue hour (seen in the chaos suite).
func TestRiverTakeoverOfADeadTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	ob := newOutbox(t, pool, &scriptSender{}, nil)

	insertOnly, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	dead, err := insertOnly.Insert(ctx, outbox.DispatchArgsForTest{OperationKind: "payout"}, nil)
	require.NoError(t, err)
	deadTakeover, err := insertOnly.Insert(ctx, outbox.DispatchArgsForTest{OperationKind: "payout", Takeover: dead.Job.ID}, nil)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '1 minute' WHERE id = ANY($1)`,
		[]int64{dead.Job.ID, deadTakeover.Job.ID})
	require.NoError(t, err)

	rc := startClient(t, pool, ob, river.NewWorkers())
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err = outbox.Enqueue(ob.Local().Context(ctx, rc), tx, outbox.EnqueueParams{Kind: "payout", BusinessKey: "ok"})
		return err
	}))
	waitForState(t, pool, outbox.StateSucceeded, 1, 15*time.Second)

	var second int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_outbox_dispatch' AND (args->>'takeover')::bigint = $1`, deadTakeover.Job.ID).Scan(&second))
	requireTakeovers(t, second, "a takeover named after the dead takeover")
}
