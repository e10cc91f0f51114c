package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// pausableKind is the delivery configuration of the paused-dispatcher test: one sender, so
// the second claimed operation waits in the dispatcher while the first is being sent.
func pausableKind(sender outbox.Sender) *outbox.KindConfig {
	return &outbox.KindConfig{Sender: sender, BatchSize: 2, Concurrency: 1, Timeout: 3 * time.Second, Lease: 4 * time.Second}
}

func init() {
	// A dispatcher that claims two operations and sends them one at a time. Every Send begun
	// prints "send-begin <id>"; the first one takes a while, so that the parent can freeze the
	// process (SIGSTOP) while the second waits for its turn.
	workflowtest.RegisterRole("outbox-pausable", func(ctx context.Context, env map[string]string) error {
		pool, err := pgxpool.New(ctx, env["DATABASE_URL"])
		if err != nil {
			return err
		}
		defer pool.Close()
		var calls atomic.Int32
		sender := outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
			fmt.Printf("send-begin %s\n", op.ID)
			if calls.Add(1) == 1 {
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
					return outbox.Receipt{}, ctx.Err()
				}
			}
			return outbox.Receipt{ExternalRef: "ref-" + op.ID.String()[:8]}, nil
		})
		ob, err := outbox.New(pool, &outbox.Config{ID: "pausable", Logger: slog.New(slog.DiscardHandler),
			Kinds: map[string]*outbox.KindConfig{"payout": pausableKind(sender)}})
		if err != nil {
			return err
		}
		n, err := ob.DeliverBatch(ctx, "payout")
		fmt.Printf("delivered claimed=%d err=%v\n", n, err)
		return nil
	})
}

// TestPausedDispatcherSendsNothingItNoLongerHolds: a dispatcher process is frozen (a real
// SIGSTOP) while one claimed operation is being sent and another waits for a sender. While it
// is frozen, its claims run out, crash recovery hands both to the reconciler, and the waiting
// one is recorded FAILED_PERMANENT (the bank refused it, say). When the process wakes, it must
// not begin a Send for that operation: its claim is gone. On 616d8b1 it did.
func TestPausedDispatcherSendsNothingItNoLongerHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testkit.DBURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	nop := outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
		return outbox.Receipt{}, errors.New("the parent never sends")
	})
	ob, err := outbox.New(pool, &outbox.Config{ID: "parent", Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": pausableKind(nop)}})
	require.NoError(t, err)
	registerKinds(t, ob)
	enqueue(t, pool, payout("paused/a", "acct-a", 100), payout("paused/b", "acct-b", 200))
	ids := []uuid.UUID{outbox.OperationID("payout", "paused/a"), outbox.OperationID("payout", "paused/b")}

	child := workflowtest.Start(t, "outbox-pausable", "DATABASE_URL="+dbURL)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	line, err := child.WaitForLine(waitCtx, "send-begin ")
	require.NoError(t, err)
	require.NoError(t, child.Stop(), "freeze the dispatcher mid-send")
	frozenAt := time.Now()
	first, err := uuid.Parse(strings.TrimSpace(line[strings.Index(line, "send-begin ")+len("send-begin "):]))
	require.NoError(t, err)
	waiting := ids[0]
	if waiting == first {
		waiting = ids[1]
	}

	// While it is frozen: the claims expire, crash recovery moves both to UNKNOWN_EXTERNAL,
	// and the waiting one is settled FAILED_PERMANENT.
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT lease_until < now() FROM stepwise_operation WHERE operation_id = $1`, waiting).Scan(&expired))
		return expired
	}, 20*time.Second, 50*time.Millisecond)
	n, err := ob.RecoverExpired(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.TransitionOneTx(ob, ctx, tx, outbox.Transition{OperationID: waiting, From: outbox.StateUnknownExternal,
			To: outbox.StateFailedPermanent, Actor: "test", Error: "the bank refused it"})
		return err
	})
	require.NoError(t, err)
	t.Logf("frozen for %s", time.Since(frozenAt).Round(time.Millisecond))

	require.NoError(t, child.Cont())
	require.NoError(t, child.Wait())
	var sends []string
	for _, l := range child.Lines() {
		if strings.Contains(l, "send-begin ") {
			sends = append(sends, l)
		}
	}
	t.Logf("child lines: %q", child.Lines())
	for _, l := range sends {
		require.NotContains(t, l, waiting.String(), "a Send began for an operation the ledger says is FAILED_PERMANENT")
	}
	require.Len(t, sends, 1, "only the send begun before the freeze")
	require.Equal(t, outbox.StateFailedPermanent, get(t, pool, waiting).State)
}

// registerKinds makes the kinds of ob known to Enqueue in the test's database.
func registerKinds(t testing.TB, ob *outbox.Outbox) {
	t.Helper()
	require.NoError(t, ob.Register(context.Background()))
}

// TestAttemptsCountRequestsNotClaims: an operation claimed twice but sent once shows one
// attempt, and the ledger holds its one request with start, end and outcome, so an operator
// can tell it from one sent twice. Here a shutdown stops the dispatcher after it claimed two
// operations and sent one; the other goes back unsent and is sent by the next dispatcher. On
// 616d8b1 attempts counted claims: 2 for the operation sent once.
func TestAttemptsCountRequestsNotClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	var stop context.CancelFunc
	var sent atomic.Int32
	sender := outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
		if sent.Add(1) == 1 {
			stop() // the process is shutting down while the second one waits for a sender
		}
		return outbox.Receipt{ExternalRef: "ref-" + op.ID.String()[:8]}, nil
	})
	ob := newOutbox(t, pool, sender, func(k *outbox.KindConfig) { k.Concurrency, k.BatchSize = 1, 2 })
	registerKinds(t, ob)
	enqueue(t, pool, payout("req/a", "acct-a", 100), payout("req/b", "acct-b", 200))

	dctx, cancel := context.WithCancel(ctx)
	stop = cancel
	n, err := ob.DeliverBatch(dctx, "payout")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, map[outbox.State]int64{outbox.StateSucceeded: 1, outbox.StateRetryable: 1}, stateCounts(t, pool))
	_, err = ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, int32(2), sent.Load(), "two requests in all")

	keys := []string{"req/a", "req/b"}
	for _, k := range keys {
		op := get(t, pool, outbox.OperationID("payout", k))
		require.Equal(t, outbox.StateSucceeded, op.State)
		require.Equal(t, 1, op.Attempts, "%s was sent once: attempts count requests, not claims", k)

	}
	var claims []int
	for _, k := range keys {
		op := get(t, pool, outbox.OperationID("payout", k))
		var c, started, ended int
		var outcomes string
		require.NoError(t, pool.QueryRow(ctx, `SELECT claims FROM stepwise_operation WHERE operation_id = $1`, op.ID).Scan(&c))
		claims = append(claims, c)
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(started_at), count(ended_at), string_agg(outcome, ',')
			FROM stepwise_operation_request WHERE operation_id = $1`, op.ID).Scan(&started, &ended, &outcomes))
		require.Equal(t, 1, started, "%s: one request started", k)
		require.Equal(t, 1, ended, "%s: one request returned", k)
		require.Equal(t, "SUCCEEDED", outcomes)
	}
	require.ElementsMatch(t, []int{1, 2}, claims, "one was claimed once, the other twice")
	twice := keys[0]
	if claims[1] == 2 {
		twice = keys[1]
	}
	rqs, err := outbox.Requests(ctx, pool, outbox.OperationID("payout", twice))
	require.NoError(t, err)
	require.Len(t, rqs, 1)
	require.Equal(t, 2, rqs[0].Claim, "sent under its second claim")
	require.NotNil(t, rqs[0].StartedAt)
	require.False(t, rqs[0].EndedAt.Before(*rqs[0].StartedAt))
}

// TestEnqueueOfAnUnregisteredKindFails: an outbox delivers "ticket"; Enqueue of "tickets" (a
// typo) must fail with ErrUnknownKind naming the kind and the registered ones, instead of
// committing an operation nothing will ever send. On 616d8b1 it succeeded and the row stayed
// PENDING silently.
func TestEnqueueOfAnUnregisteredKindFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	ob, err := outbox.New(pool, &outbox.Config{ID: "tickets", Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"ticket": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			return outbox.Receipt{}, nil
		})}}})
	require.NoError(t, err)
	// In the outbox's context, as in a job of its client: the kinds found are kept in its Local.
	lctx := ob.Local().Context(ctx, nil)
	enqIn := func(ctx context.Context, kind string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.EnqueueParams{Kind: kind, BusinessKey: "t-1"})
			return err
		})
	}
	enq := func(kind string) error { return enqIn(lctx, kind) }
	// Install only wires River's config; the kinds are recorded by Register (which
	// stepwise.Client.Start calls), with a context.
	require.NoError(t, ob.Install(&river.Config{}))
	err = enq("ticket")
	require.ErrorIs(t, err, outbox.ErrUnknownKind, "Install alone records nothing")
	require.Contains(t, err.Error(), "Start a stepwise.Client", "names the fix")
	require.NoError(t, ob.Register(ctx))

	err = enq("tickets")
	require.ErrorIs(t, err, outbox.ErrUnknownKind, "a kind no outbox registered")
	require.Contains(t, err.Error(), `"tickets"`)
	require.Contains(t, err.Error(), `"ticket"`, "names the registered kinds")
	require.Equal(t, map[outbox.State]int64{}, stateCounts(t, pool), "nothing committed")

	require.NoError(t, enq("ticket"))
	// The registry is read once per kind and client: with its row gone (a registration is
	// never taken back; the test takes it to see the cache), the client's Local still knows
	// the kind, and a context without a Local reads the registry and refuses it.
	_, err = pool.Exec(ctx, `DELETE FROM stepwise_outbox_kind WHERE kind = 'ticket'`)
	require.NoError(t, err)
	require.NoError(t, enq("ticket"), "the registered kind, again: cached in the Local, no read")
	require.ErrorIs(t, enqIn(ctx, "ticket"), outbox.ErrUnknownKind, "no Local, no cache: the registry is read")
	require.Equal(t, map[outbox.State]int64{outbox.StatePending: 1}, stateCounts(t, pool))
}
