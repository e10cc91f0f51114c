package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// holdArgs is a one-step run that enqueues a payout; with Hold set its step waits, with its
// transaction open after Enqueue, until the test lets it go.
type holdArgs struct {
	Name string `json:"name"`
	Hold bool   `json:"hold"`
}

func (holdArgs) Kind() string { return "test_hold_after_enqueue" }

type holdCursor struct{}

type holdWorker struct {
	workflow.StepperDefaults[holdArgs, holdCursor]
	enqueued chan string   // receives a run's name once its Enqueue returned
	release  chan struct{} // closed to let held steps commit
}

func (w *holdWorker) Step(ctx context.Context, s *workflow.Step[holdArgs, holdCursor]) (workflow.Next, error) {
	op := payout("hold/"+s.Args.Name, "acct", 100)
	op.RunKey = s.RunKey
	if _, err := outbox.Enqueue(ctx, s.Tx, op); err != nil {
		return workflow.Next{}, err
	}
	w.enqueued <- s.Args.Name
	if s.Args.Hold {
		select {
		case <-w.release:
		case <-ctx.Done():
			return workflow.Next{}, ctx.Err()
		}
	}
	return workflow.Done(), nil
}

// TestConcurrentRunsDoNotWaitOnEachOthersWake checks that no lock shared between runs is
// held from Enqueue to commit (runs that share one would queue on each other): run A's step enqueues a payout and keeps its transaction
// open; run B's step enqueues a payout of the same kind and must commit meanwhile. When
// Enqueue woke the dispatcher with a unique River insert inside the step's transaction, B
// waited on the wake job's row until A committed.
func TestConcurrentRunsDoNotWaitOnEachOthersWake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	quiet := slog.New(slog.DiscardHandler)
	var sent atomic.Int64
	ob, err := outbox.New(pool, &outbox.Config{Logger: quiet, Kinds: map[string]*outbox.KindConfig{"payout": {
		Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			sent.Add(1)
			return outbox.Receipt{ExternalRef: "ref"}, nil
		}),
	}}})
	require.NoError(t, err)
	engine, err := workflow.New(pool, &workflow.Config{Lease: 30 * time.Second, Logger: quiet})
	require.NoError(t, err)
	w := &holdWorker{enqueued: make(chan string, 4), release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(w.release)
		}
	}
	defer release()
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, w)
	rc := &river.Config{Logger: quiet, Workers: workers, TestOnly: true,
		FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}}
	require.NoError(t, engine.Install(rc))
	require.NoError(t, ob.Install(rc))
	require.NoError(t, ob.Register(context.Background()))
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(sctx))
	})

	runA, err := workflow.Start(ctx, client, "hold/A", holdArgs{Name: "A", Hold: true}, nil)
	require.NoError(t, err)
	select {
	case name := <-w.enqueued:
		require.Equal(t, "A", name)
	case <-time.After(30 * time.Second):
		t.Fatal("run A's step did not reach its Enqueue")
	}

	// A's step transaction is open, after its Enqueue. B enqueues the same kind.
	startB := time.Now()
	runB, err := workflow.Start(ctx, client, "hold/B", holdArgs{Name: "B"}, nil)
	require.NoError(t, err)
	const patience = 5 * time.Second // B's step is a few statements; this is slack for a loaded machine
	var b *workflow.Run
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		b, err = workflow.GetRun(ctx, pool, runB.Key)
		require.NoError(t, err)
		if b.Status == workflow.RunStatusSucceeded || time.Now().After(deadline) {
			break
		}
	}
	a, err := workflow.GetRun(ctx, pool, runA.Key)
	require.NoError(t, err)
	t.Logf("run B %s %s after its start, while run A's step held its transaction (A is %s)", b.Status, time.Since(startB).Round(time.Millisecond), a.Status)
	require.Equal(t, workflow.RunStatusSucceeded, b.Status,
		"run B's step waited %s on run A's open transaction: Enqueue holds a lock shared between runs", patience)
	require.NotEqual(t, workflow.RunStatusSucceeded, a.Status, "run A is still held")

	// And both payouts are delivered once A commits.
	release()
	waitForState(t, pool, outbox.StateSucceeded, 2, 30*time.Second)
	require.EqualValues(t, 2, sent.Load())
}

// TestWakeAfterCommitWithNoDispatcherRunning is the wake's guarantee: an operation committed
// with a River client in the context is picked up within about a second although no
// dispatcher runs when it commits and the poll is off, also when the step's transaction stays
// open a while after Enqueue, and also when the dispatcher of the previous operation is just
// finishing (completing its job) as the next one commits. It also shows that a rolled-back
// Enqueue delivers nothing.
func TestWakeAfterCommitWithNoDispatcherRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	var sent atomic.Int64
	ob, err := outbox.New(pool, &outbox.Config{
		Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			sent.Add(1)
			return outbox.Receipt{ExternalRef: "ref"}, nil
		})}},
		PollInterval: time.Hour, // only the poll at start: everything after must come from wakes
	})
	require.NoError(t, err)
	client := startClient(t, pool, ob, river.NewWorkers())
	wctx := ob.Local().Context(ctx, client)

	// Let the poll at start pass, and make sure no dispatcher is queued or running.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var live int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_outbox_dispatch'
			AND state NOT IN ('completed', 'cancelled', 'discarded')`).Scan(&live))
		var polls int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_outbox_poll' AND state = 'completed'`).Scan(&polls))
		if live == 0 && polls > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the poll at start did not finish")
	}

	// A rolled-back Enqueue: nothing to deliver, and nothing left pending.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := outbox.Enqueue(wctx, tx, payout("rolled-back", "acct", 1))
	require.NoError(t, err)
	require.True(t, res.Woken)
	require.NoError(t, tx.Rollback(ctx))

	holds := []time.Duration{300 * time.Millisecond, 0, 5 * time.Millisecond, 0, 30 * time.Millisecond, 0, 100 * time.Millisecond, 0}
	var worst time.Duration
	for i, hold := range holds {
		var committed time.Time
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := outbox.Enqueue(wctx, tx, payout(fmt.Sprintf("op-%d", i), "acct", int64(i+1)))
			if err != nil {
				return err
			}
			if !res.Woken {
				return fmt.Errorf("op-%d: Enqueue with a client in the context did not arrange a wake", i)
			}
			time.Sleep(hold) // the step goes on after its Enqueue; the wake must wait for the commit
			committed = time.Now()
			return nil
		})
		require.NoError(t, err)
		// The next operation commits right after this one is delivered: its dispatcher is
		// then completing (or has just completed) its job, the window in which a wake
		// could be swallowed.
		waitForState(t, pool, outbox.StateSucceeded, int64(i+1), 15*time.Second)
		took := time.Since(committed)
		worst = max(worst, took)
		t.Logf("op-%d (held %s after Enqueue): delivered %s after its commit", i, hold, took.Round(time.Millisecond))
	}
	t.Logf("slowest pickup: %s (the guarantee is about a second; the assertion leaves slack for a loaded machine)", worst.Round(time.Millisecond))
	require.Less(t, worst, 5*time.Second)
	require.EqualValues(t, len(holds), sent.Load(), "the rolled-back operation was not sent")
	var total int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation`).Scan(&total))
	require.Equal(t, len(holds), total)
}

// TestWakerBacksOffWhileItsDispatcherWaits: while the dispatcher job the waker queued is
// still waiting to start (no worker of this process works its queue, or they are busy), it
// will deliver every commit before its start, and looking every wakeTick to confirm it still
// waits is a statement per step at one payout per step. The waker backs off instead. Not
// parallel: it counts the looks of every waker in the process.
func TestWakerBacksOffWhileItsDispatcherWaits(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	ob, err := outbox.New(pool, &outbox.Config{Logger: slog.New(slog.DiscardHandler), Kinds: map[string]*outbox.KindConfig{
		"payout": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil })},
	}})
	require.NoError(t, err)
	require.NoError(t, ob.Register(ctx))
	workers := river.NewWorkers()
	require.NoError(t, ob.Install(&river.Config{Workers: workers}))
	// Never started: nothing here works the dispatcher's queue.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Workers: workers, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	wctx := ob.Local().Context(ctx, client)

	const commits, every = 60, 15 * time.Millisecond
	before := outbox.WakeLooksForTest(ob)
	start := time.Now()
	for i := range commits {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(wctx, tx, payout(fmt.Sprintf("b-%d", i), "acct", 1))
			return err
		}))
		time.Sleep(every)
	}
	elapsed := time.Since(start)
	time.Sleep(400 * time.Millisecond) // the waker's last looks
	looks := outbox.WakeLooksForTest(ob) - before
	var queued int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_outbox_dispatch' AND state = 'available'`).Scan(&queued))
	t.Logf("%d commits over %s: %d looks (%.2f a commit), %d dispatcher job queued", commits, elapsed.Round(time.Millisecond), looks, float64(looks)/commits, queued)
	require.Equal(t, 1, queued, "one wake queued the dispatcher; the rest found it waiting")
	// A look every 20 ms would be about elapsed/20ms (over 50 here); backed off to 160 ms,
	// about a tenth of that.
	require.Less(t, looks, int64(elapsed/(20*time.Millisecond))/2, "the waker kept looking every tick at a dispatcher job that was still waiting")
}

// A process that closes its pool while its waker still holds committed transactions (every
// clean shutdown right after a step commits) drops those wakes at once and says so at INFO:
// the operations are committed PENDING, and the poll of any running process, or of this one's
// next start, delivers them. Guards against: a WARN on every clean shutdown, which teaches the
// people on call to ignore the outbox's warnings, and a goroutine retrying a dead pool.
// Not parallel: it captures slog's default logger, which the waker logs to.
func TestWakerDropsItsWakesQuietlyWhenThePoolCloses(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	ob := newOutbox(t, pool, outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil }), nil)
	// The waker's client has a pool of its own, which the test closes.
	own, err := pgxpool.New(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	defer own.Close()
	workers := river.NewWorkers()
	require.NoError(t, ob.Install(&river.Config{Workers: workers}))
	client, err := river.NewClient(riverpgxv5.New(own), &river.Config{Workers: workers, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	var logs syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(prev)

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ob.Local().Context(ctx, client), tx, payout("shutdown", "acct", 1))
		return err
	}))
	own.Close() // before the waker's first look, wakeTick after the commit

	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "stepwise outbox:") },
		5*time.Second, 10*time.Millisecond, "the waker said nothing about the wakes it dropped")
	time.Sleep(300 * time.Millisecond) // the retries the waker would make
	t.Log(logs.String())
	require.Contains(t, logs.String(), "level=INFO")
	require.Contains(t, logs.String(), "the pool is closed")
	require.Contains(t, logs.String(), "transactions=1")
	require.NotContains(t, logs.String(), "level=WARN")
	require.Equal(t, map[outbox.State]int64{outbox.StatePending: 1}, stateCounts(t, pool), "the operation stays committed, for the poll")
}
