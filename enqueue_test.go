package stepwise

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/outbox"
)

// TestOperationEnqueueTxWakesAfterCommitWithoutLocking: operations enqueued through the client
// outside any job (an HTTP handler's transaction) are sent within seconds of their commit,
// with the poll an hour away, and one handler's open transaction does not hold up another's
// enqueue of the same kind. Guards against the wake falling back into the caller's
// transaction (no waker found in the context): the second transaction then waits on the
// kind's dispatcher job row until the first commits (measured before the waker: 2.27 s behind
// an open step), and a frozen handler blocks every other.
func TestOperationEnqueueTxWakesAfterCommitWithoutLocking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := smallPool(t, 20)
	c, sent := startNoticeClient(t, pool)

	open, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	res, err := c.OperationEnqueueTx(ctx, open, outbox.EnqueueParams{Kind: "notice", BusinessKey: "held"})
	require.NoError(t, err)
	require.True(t, res.Woken)

	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := c.OperationEnqueueTx(ctx, tx, outbox.EnqueueParams{Kind: "notice", BusinessKey: "free"})
			return err
		})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(3 * time.Second):
		t.Fatal("an enqueue of the kind waited for another transaction's commit: the wake took a lock in the caller's transaction")
	}
	select {
	case key := <-sent:
		require.Equal(t, "free", key, "the committed one is sent, the open one is not")
	case <-time.After(5 * time.Second):
		t.Fatal("no send within 5 s of the commit, with the poll an hour away: the wake after the commit did not happen")
	}
	require.NoError(t, open.Commit(ctx))
	select {
	case key := <-sent:
		require.Equal(t, "held", key)
	case <-time.After(5 * time.Second):
		t.Fatal("the held transaction's operation was not sent within 5 s of its commit")
	}

	_, err = c.OperationEnqueueTx(ctx, nil, outbox.EnqueueParams{Kind: "notice", BusinessKey: "x"})
	require.ErrorContains(t, err, "tx is nil")

	// A transaction of another database is refused: its operations would wait there for a
	// poll that never looks at them, reported woken.
	other := testkit.DB(t)
	err = pgx.BeginFunc(ctx, other, func(tx pgx.Tx) error {
		_, err := c.OperationEnqueueTx(ctx, tx, outbox.EnqueueParams{Kind: "notice", BusinessKey: "elsewhere"})
		return err
	})
	require.ErrorContains(t, err, "enqueue in a transaction of the client's pool")
}

// TestEnqueueOnlyClientWakesTheDeliveringProcess: a client with no kinds of its own (a web
// tier that enqueues what a worker tier delivers) wakes the delivering client's dispatcher
// after its commit, with the poll an hour away. Guards against its wakes being refused by
// River (its Workers bundle has no dispatcher worker) and dropped after three tries while
// Enqueue reported them woken.
func TestEnqueueOnlyClientWakesTheDeliveringProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := smallPool(t, 30)
	_, sent := startNoticeClient(t, pool)

	web, err := NewClient(pool, &Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var res *outbox.EnqueueResult
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err = web.OperationEnqueueTx(ctx, tx, outbox.EnqueueParams{Kind: "notice", BusinessKey: "from-web"})
		return err
	}))
	require.True(t, res.Woken)
	committed := time.Now()
	select {
	case key := <-sent:
		require.Equal(t, "from-web", key)
		t.Logf("sent %s after the commit", time.Since(committed).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the enqueue-only client's wake did not reach the delivering client within 5 s (the poll is an hour away)")
	}
}

// waitStartupPoll waits until the outbox's periodic poll, which runs once when River elects
// a leader after Start, has completed: after it, with PollInterval an hour, only a wake
// delivers.
func waitStartupPoll(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM river_job WHERE kind = 'stepwise_outbox_poll' AND state = 'completed'`).Scan(&n))
		return n > 0
	}, 30*time.Second, 20*time.Millisecond, "the start-up poll did not run")
}

// startNoticeClient starts a client delivering the kind "notice" (each send's business key
// goes to sent) with its poll an hour away, and returns once the start-up poll has run: from
// then on only a wake sends.
func startNoticeClient(t *testing.T, pool *pgxpool.Pool) (*Client, <-chan string) {
	t.Helper()
	sent := make(chan string, 10)
	c, err := NewClient(pool, &Config{
		Logger: slog.New(slog.DiscardHandler),
		Outbox: &outbox.Config{PollInterval: time.Hour},
		Kinds: map[string]*KindConfig{"notice": {
			Sender: outbox.SendFunc(func(_ context.Context, op *outbox.Operation) (outbox.Receipt, error) {
				sent <- op.BusinessKey
				return outbox.Receipt{}, nil
			}),
		}},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	waitStartupPoll(t, pool)
	return c, sent
}
