package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestDeliveryClassifiesEachFaultOfTheBank sends one operation into each fault of the fake
// bank and checks the state it lands in, the bank's own count of effects, and that nothing
// ambiguous is ever resent.
func TestDeliveryClassifiesEachFaultOfTheBank(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	bank, client := startBank(t, &fakebank.Config{Delay: 3 * time.Second}, 5*time.Second, false)
	ob := newOutbox(t, pool, bankSender{Client: client}, func(kc *outbox.KindConfig) {
		kc.Timeout = 500 * time.Millisecond
		kc.BatchSize = 50
	})

	cases := []struct {
		key     string
		account string
		fault   fakebank.Fault
		want    outbox.State
		effects int
	}{
		{"ok", "acct-ok", fakebank.NoFault, outbox.StateSucceeded, 1},
		{"declined", "closed-acct", fakebank.NoFault, outbox.StateFailedPermanent, 1},
		{"refused", "acct-r", fakebank.RefuseBeforeApply, outbox.StateRetryable, 0},
		{"5xx-before", "acct-b", fakebank.Error5xxBeforeApply, outbox.StateUnknownExternal, 0},
		{"5xx-after", "acct-a", fakebank.Error5xxAfterApply, outbox.StateUnknownExternal, 1},
		{"drop", "acct-d", fakebank.DropAfterApply, outbox.StateUnknownExternal, 1},
		{"timeout", "acct-t", fakebank.DelayAfterApply, outbox.StateUnknownExternal, 1},
	}
	var ops []outbox.EnqueueParams
	for _, tc := range cases {
		op := payout(tc.key, tc.account, 100)
		ops = append(ops, op)
		if tc.fault != fakebank.NoFault {
			bank.FailKey(outbox.OperationID("payout", tc.key).String(), tc.fault)
		}
	}
	enqueue(t, pool, ops...)

	n, err := ob.DeliverBatch(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, len(cases), n)

	for _, tc := range cases {
		id := outbox.OperationID("payout", tc.key)
		op := get(t, pool, id)
		require.Equal(t, tc.want, op.State, "%s: %s", tc.key, op.LastError)
		require.Equal(t, tc.effects, bank.Effects(id.String()), tc.key)
		require.Equal(t, 1, op.Attempts, tc.key)
		require.NotNil(t, op.LastSentAt, tc.key)
		require.Nil(t, op.LeaseUntil, tc.key)
		require.Equal(t, []string{"PENDING>PROCESSING", "PROCESSING>" + string(tc.want)}, events(t, pool, id), tc.key)
		switch tc.want {
		case outbox.StateSucceeded:
			require.NotEmpty(t, op.ExternalRef)
			require.NotNil(t, op.FinishedAt)
		case outbox.StateUnknownExternal:
			require.NotEmpty(t, op.LastError)
			require.NotNil(t, op.NextCheckAt)
			require.NotNil(t, op.UnknownSince)
			require.Nil(t, op.FinishedAt)
		default:
			require.NotEmpty(t, op.LastError)
		}
	}

	// The refused one is sent again under the same id and lands once; the ambiguous ones
	// are never resent by the dispatcher.
	before := bank.Stats().Requests
	_, err = ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, before+1, bank.Stats().Requests, "only the RETRYABLE operation is sent again")
	refused := get(t, pool, outbox.OperationID("payout", "refused"))
	require.Equal(t, outbox.StateSucceeded, refused.State)
	require.Equal(t, 2, refused.Attempts)
	require.Equal(t, 1, bank.Effects(refused.ID.String()))
	require.Empty(t, bank.DuplicateReferences())
	counts := stateCounts(t, pool)
	require.Equal(t, int64(4), counts[outbox.StateUnknownExternal])
}

func TestDeliveryBankDownIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	bank, client := startBank(t, nil, 2*time.Second, false)
	ob := newOutbox(t, pool, bankSender{Client: client}, nil)

	require.NoError(t, bank.SetDown(true))
	enqueue(t, pool, payout("k", "acct", 10))
	_, err := ob.DeliverBatch(ctx, "payout")
	require.NoError(t, err)
	op := get(t, pool, outbox.OperationID("payout", "k"))
	require.Equal(t, outbox.StateRetryable, op.State, "a refused dial proves the request never left: %s", op.LastError)

	require.NoError(t, bank.SetDown(false))
	_, err = ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, get(t, pool, op.ID).State)
	require.Equal(t, 1, bank.Effects(op.ID.String()))
}

// scriptSender answers by business key, to reach the classifications the bank cannot
// produce: a panic, an unclassified error, a sender that overruns its timeout.
type scriptSender struct{ calls atomic.Int64 }

func (s *scriptSender) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	s.calls.Add(1)
	switch op.BusinessKey {
	case "ok":
		return outbox.Receipt{ExternalRef: "ref-" + op.BusinessKey}, nil
	case "permanent":
		return outbox.Receipt{}, outbox.Permanent(errors.New("account closed"))
	case "not-sent":
		return outbox.Receipt{}, outbox.NotSent(errors.New("429 not processed"))
	case "unclassified":
		return outbox.Receipt{}, errors.New("something odd happened")
	case "panic":
		panic("sender bug")
	case "hang":
		<-ctx.Done()
		return outbox.Receipt{}, ctx.Err()
	}
	return outbox.Receipt{}, errors.New("unexpected key")
}

func TestDeliveryClassification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	sender := &scriptSender{}
	ob := newOutbox(t, pool, sender, func(kc *outbox.KindConfig) {
		kc.Timeout = 200 * time.Millisecond
		kc.RetryBackoff = func(int) time.Duration { return time.Hour }
	})

	want := map[string]outbox.State{
		"ok":           outbox.StateSucceeded,
		"permanent":    outbox.StateFailedPermanent,
		"not-sent":     outbox.StateRetryable,
		"unclassified": outbox.StateUnknownExternal,
		"panic":        outbox.StateUnknownExternal,
		"hang":         outbox.StateUnknownExternal,
	}
	for key := range want {
		enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: key})
	}
	_, err := ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, int64(len(want)), sender.calls.Load(), "each sent once; the RETRYABLE one waits for its backoff")
	for key, state := range want {
		op := get(t, pool, outbox.OperationID("payout", key))
		require.Equal(t, state, op.State, key)
		if key == "ok" {
			require.Equal(t, "ref-ok", op.ExternalRef)
		}
	}
	retry := get(t, pool, outbox.OperationID("payout", "not-sent"))
	require.WithinDuration(t, time.Now().Add(time.Hour), retry.NextAttemptAt, time.Minute)
	require.Contains(t, get(t, pool, outbox.OperationID("payout", "panic")).LastError, "sender panicked")
}

func TestRetryableGivesUpToManual(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	sender := &scriptSender{}
	ob := newOutbox(t, pool, sender, func(kc *outbox.KindConfig) { kc.MaxAttempts = 3 })

	enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: "not-sent"})
	_, err := ob.Drain(ctx, "payout")
	require.NoError(t, err)
	op := get(t, pool, outbox.OperationID("payout", "not-sent"))
	require.Equal(t, outbox.StateManual, op.State)
	require.Equal(t, 3, op.Attempts)
	require.Contains(t, op.ManualReason, "not sent after 3 attempts")
	require.Equal(t, int64(3), sender.calls.Load())
}

// TestExpiredLeaseBecomesUnknown: a dispatcher that died between claiming and recording
// leaves PROCESSING behind. After the lease it is UNKNOWN_EXTERNAL, never sent again.
func TestExpiredLeaseBecomesUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	sender := &scriptSender{}
	ob := newOutbox(t, pool, sender, nil)

	enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: "ok"}, outbox.EnqueueParams{Kind: "payout", BusinessKey: "ok-2"})
	id := outbox.OperationID("payout", "ok")
	// What a killed dispatcher leaves: claimed, lease running out, nothing recorded.
	_, err := pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'PROCESSING', attempts = 1,
		lease_until = now() + interval '1 hour', leased_by = 'dead/1', last_sent_at = now() WHERE operation_id = $1`, id)
	require.NoError(t, err)

	_, err = ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, outbox.StateProcessing, get(t, pool, id).State, "a live lease is respected")
	require.Equal(t, int64(1), sender.calls.Load(), "only the other operation was sent")

	_, err = pool.Exec(ctx, `UPDATE stepwise_operation SET lease_until = now() - interval '1 second' WHERE operation_id = $1`, id)
	require.NoError(t, err)
	n, err := ob.RecoverExpired(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	op := get(t, pool, id)
	require.Equal(t, outbox.StateUnknownExternal, op.State)
	require.Contains(t, op.LastError, "dead/1")
	_, err = ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, int64(1), sender.calls.Load(), "never resent blindly")
	require.Equal(t, outbox.StateUnknownExternal, get(t, pool, id).State)
}

func TestOutcomeCallbackRunsInTheRecordingTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `CREATE TABLE settlement (key text PRIMARY KEY, status text NOT NULL)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO settlement VALUES ('ok', 'SETTLED'), ('permanent', 'SETTLED'), ('ok-refuses', 'SETTLED')`)
	require.NoError(t, err)

	sender := outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
		if op.BusinessKey == "permanent" {
			return outbox.Receipt{}, outbox.Permanent(errors.New("declined"))
		}
		return outbox.Receipt{ExternalRef: "r"}, nil
	})
	var calls atomic.Int64
	ob := newOutbox(t, pool, sender, func(kc *outbox.KindConfig) {
		kc.Timeout = 100 * time.Millisecond
		kc.BatchSize = 10
		kc.Lease = time.Second
		kc.OnOutcome = func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, oc outbox.Outcome) error {
			calls.Add(1)
			if op.BusinessKey == "ok-refuses" {
				return errors.New("business rule refuses")
			}
			status := map[outbox.State]string{outbox.StateSucceeded: "PAID", outbox.StateFailedPermanent: "PAYOUT_FAILED"}[oc.To]
			_, err := tx.Exec(ctx, `UPDATE settlement SET status = $2 WHERE key = $1`, op.BusinessKey, status)
			return err
		}
	})
	enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: "ok"},
		outbox.EnqueueParams{Kind: "payout", BusinessKey: "permanent"},
		outbox.EnqueueParams{Kind: "payout", BusinessKey: "ok-refuses"})
	_, err = ob.DeliverBatch(ctx, "payout")
	require.NoError(t, err)

	status := func(key string) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM settlement WHERE key = $1`, key).Scan(&s))
		return s
	}
	require.Equal(t, "PAID", status("ok"))
	require.Equal(t, "PAYOUT_FAILED", status("permanent"))
	require.Equal(t, outbox.StateSucceeded, get(t, pool, outbox.OperationID("payout", "ok")).State)

	// The refused outcome is not recorded without its business change: the operation stays
	// PROCESSING, and after its lease becomes UNKNOWN_EXTERNAL for the reconciler. The other
	// operations of the batch were not held back by it.
	refused := get(t, pool, outbox.OperationID("payout", "ok-refuses"))
	require.Equal(t, outbox.StateProcessing, refused.State)
	require.Contains(t, refused.LastError, "business rule refuses")
	require.Equal(t, "SETTLED", status("ok-refuses"))
}

func TestTransitionGuards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	ob := newOutbox(t, pool, &scriptSender{}, nil)
	enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: "unclassified"})
	_, err := ob.Drain(ctx, "payout")
	require.NoError(t, err)
	id := outbox.OperationID("payout", "unclassified")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)

	_, err = outbox.TransitionOneTx(ob, ctx, tx, outbox.Transition{OperationID: id, From: outbox.StateManual, To: outbox.StateSucceeded, Actor: "alice"})
	require.ErrorIs(t, err, outbox.ErrStateChanged)
	require.Contains(t, err.Error(), "UNKNOWN_EXTERNAL")

	_, err = outbox.TransitionOneTx(ob, ctx, tx, outbox.Transition{OperationID: id, From: outbox.StateSucceeded, To: outbox.StateRetryable, Actor: "alice"})
	require.ErrorIs(t, err, outbox.ErrInvalidTransition)

	_, err = outbox.TransitionOneTx(ob, ctx, tx, outbox.Transition{OperationID: uuid.New(), From: outbox.StateManual, To: outbox.StateSucceeded, Actor: "alice"})
	require.ErrorIs(t, err, outbox.ErrNotFound)

	op, err := outbox.TransitionOneTx(ob, ctx, tx, outbox.Transition{OperationID: id, From: outbox.StateUnknownExternal, To: outbox.StateSucceeded, Actor: "alice", ExternalRef: "found"})
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, op.State)
	require.Equal(t, "found", op.ExternalRef)
}

func TestRateLimitSpacesSends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	var mu sync.Mutex
	var starts []time.Time
	sender := outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		return outbox.Receipt{}, nil
	})
	const rate = 100.0
	ob := newOutbox(t, pool, sender, func(kc *outbox.KindConfig) { kc.RatePerSecond, kc.Concurrency = rate, 8 })
	for i := range 20 {
		enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: fmt.Sprintf("k-%d", i)})
	}
	_, err := ob.Drain(ctx, "payout")
	require.NoError(t, err)
	require.Len(t, starts, 20)
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	// A lower bound only, so no machine is too fast for it: slots are 1/rate apart, and a
	// goroutine that wakes late for its slot can shorten the span by less than one slot.
	interval := time.Duration(float64(time.Second) / rate)
	require.GreaterOrEqual(t, starts[len(starts)-1].Sub(starts[0]), time.Duration(len(starts)-2)*interval)
}

func TestLastErrorIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	huge := strings.Repeat("é", 5000) // a multi-byte rune, so the cut must respect boundaries
	ob := newOutbox(t, pool, outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
		return outbox.Receipt{}, errors.New(huge)
	}), nil)
	enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: "k"})
	_, err := ob.Drain(ctx, "payout")
	require.NoError(t, err)
	op := get(t, pool, outbox.OperationID("payout", "k"))
	require.Equal(t, outbox.StateUnknownExternal, op.State)
	require.LessOrEqual(t, len(op.LastError), 1024)
	require.True(t, utf8.ValidString(op.LastError))
	require.True(t, strings.HasSuffix(op.LastError, "…"))
}

// A dispatcher keeps a batch queued behind the sends in flight: it claims the next batch while
// Concurrency + BatchSize operations are outstanding, so a sender that finishes during the
// claim's round trip finds work. When it claimed only once at most Concurrency (or a batch)
// were outstanding, every claim left senders idle for its round trip (6-8% of the time at
// Concurrency 256 and a 50 ms bank in the bench's slowbank section).
func TestDispatcherClaimsAheadOfItsSenders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	const concurrency, batch, quick = 4, 4, 8
	release := make(chan struct{})
	var sends, hanging atomic.Int32
	sender := outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
		if sends.Add(1) > quick { // the first sends answer at once, the rest hang
			hanging.Add(1)
			<-release
		}
		return outbox.Receipt{}, nil
	})
	ob := newOutbox(t, pool, sender, func(kc *outbox.KindConfig) {
		kc.Concurrency, kc.BatchSize, kc.Timeout, kc.Lease = concurrency, batch, 10*time.Second, 30*time.Second
	})
	for i := range 40 {
		enqueue(t, pool, outbox.EnqueueParams{Kind: "payout", BusinessKey: fmt.Sprintf("k-%d", i)})
	}
	drained := make(chan error, 1)
	go func() { _, err := ob.Drain(ctx, "payout"); drained <- err }()
	defer func() {
		close(release)
		require.NoError(t, <-drained)
		require.Equal(t, int64(40), stateCounts(t, pool)[outbox.StateSucceeded])
	}()
	// Every sender hangs; each answer before let the dispatcher claim again while no more
	// than Concurrency + BatchSize were outstanding. What it holds once the recorder has
	// flushed is what it claimed ahead of its senders. The last claim follows the last
	// recording asynchronously, so it is waited for: read at once, beside a CPU hog the
	// count was taken between the two (8, the old threshold's answer, which never grows).
	require.Eventually(t, func() bool { return hanging.Load() == concurrency }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return stateCounts(t, pool)[outbox.StateSucceeded] == quick }, 5*time.Second, 10*time.Millisecond)
	var held int64
	require.Eventually(t, func() bool {
		held = stateCounts(t, pool)[outbox.StateProcessing]
		return held > int64(concurrency+batch)
	}, 10*time.Second, 10*time.Millisecond, "operations claimed while %d sends hang: %d, want more than Concurrency + BatchSize", concurrency, held)
	time.Sleep(200 * time.Millisecond) // and it claims no further while they hang
	held = stateCounts(t, pool)[outbox.StateProcessing]
	require.LessOrEqual(t, held, int64(concurrency+2*batch), "operations claimed while %d sends hang", concurrency)
}
