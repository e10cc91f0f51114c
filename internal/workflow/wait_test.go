package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/runwait"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// waitArgs drive waitWorker: step 1 waits (for a signal, its operations or its children),
// step 2 records what it learned (Step.Woken) in wait_log and finishes.
type waitArgs struct {
	Mode      string `json:"mode"` // signal | ops | children | child
	TimeoutMS int    `json:"timeout_ms"`
	N         int    `json:"n"`
	Fail      int    `json:"fail,omitempty"`   // ops: how many the sender refuses for good
	Manual    int    `json:"manual,omitempty"` // ops: how many end MANUAL (never sent), after those
}

func (waitArgs) Kind() string { return "test_wait" }

type waitCursor struct {
	Phase int `json:"phase"`
}

const waitOpKind = "test_wait_op"

type waitWorker struct {
	workflow.StepperDefaults[waitArgs, waitCursor]
}

func (w *waitWorker) Step(ctx context.Context, s *workflow.Step[waitArgs, waitCursor]) (workflow.Next, error) {
	timeout := time.Duration(s.Args.TimeoutMS) * time.Millisecond
	if s.Cursor.Phase == 0 {
		s.Cursor.Phase = 1
		switch s.Args.Mode {
		case "signal", "child":
			// When the run's first step began: River's own start-to-fetch latency, the
			// baseline of the wake latency.
			if _, err := s.Tx.Exec(ctx, `INSERT INTO wait_first (run_key, at) VALUES ($1, $2) ON CONFLICT DO NOTHING`, s.RunKey, time.Now()); err != nil {
				return workflow.Next{}, err
			}
			return workflow.WaitForSignal("go", timeout), nil
		case "ops":
			ops := make([]outbox.EnqueueParams, s.Args.N)
			for i := range ops {
				bk := fmt.Sprintf("%s/%d", s.RunKey, i)
				switch {
				case i < s.Args.Fail:
					bk += "/refuse"
				case i < s.Args.Fail+s.Args.Manual:
					bk += "/manual"
				}
				ops[i] = outbox.EnqueueParams{Kind: waitOpKind, BusinessKey: bk, Payload: json.RawMessage(`{}`)}
			}
			if _, err := outbox.Enqueue(ctx, s.Tx, ops...); err != nil {
				return workflow.Next{}, err
			}
			return workflow.WaitForOperations(timeout), nil
		case "children":
			for i := range s.Args.N {
				if _, err := s.StartChild(ctx, fmt.Sprintf("%s/child-%d", s.RunKey, i), waitArgs{Mode: "child", TimeoutMS: 600_000}, nil); err != nil {
					return workflow.Next{}, err
				}
			}
			return workflow.WaitForChildren(timeout), nil
		}
		return workflow.Next{}, fmt.Errorf("unknown mode %q", s.Args.Mode)
	}
	woken, err := json.Marshal(s.Woken())
	if err != nil {
		return workflow.Next{}, err
	}
	if _, err := s.Tx.Exec(ctx, `INSERT INTO wait_log (run_key, woken, at) VALUES ($1, $2, $3)`, s.RunKey, woken, time.Now()); err != nil {
		return workflow.Next{}, err
	}
	return workflow.Done(), nil
}

type waitEnv struct {
	pool   *pgxpool.Pool
	engine *workflow.Engine
	client *river.Client[pgx.Tx]
	gate   chan struct{} // closed: the sender answers; until then it blocks
	ob     *outbox.Outbox
}

// newWaitEnv starts a River client with waitWorker and an outbox whose sender succeeds (or
// refuses for good the business keys ending "/refuse") once gate is closed.
func newWaitEnv(t testing.TB, pool *pgxpool.Pool, gateOpen bool) *waitEnv {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS wait_log (run_key text PRIMARY KEY, woken jsonb, at timestamptz NOT NULL);
		CREATE TABLE IF NOT EXISTS wait_first (run_key text PRIMARY KEY, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger(), Lease: 5 * time.Second, MaintenanceInterval: time.Hour})
	require.NoError(t, err)
	we := &waitEnv{pool: pool, engine: engine, gate: make(chan struct{})}
	if gateOpen {
		close(we.gate)
	}
	ob, err := outbox.New(pool, &outbox.Config{Logger: quietLogger(), Kinds: map[string]*outbox.KindConfig{
		waitOpKind: {Sender: outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
			select {
			case <-we.gate:
			case <-ctx.Done():
				return outbox.Receipt{}, outbox.NotSent(ctx.Err())
			}
			switch {
			case strings.HasSuffix(op.BusinessKey, "/refuse"):
				return outbox.Receipt{}, outbox.Permanent(errors.New("refused"))
			case strings.HasSuffix(op.BusinessKey, "/manual"):
				return outbox.Receipt{}, outbox.NotSent(errors.New("down")) // one attempt allowed: MANUAL
			}
			return outbox.Receipt{}, nil
		}), MaxAttempts: 1},
	}})
	require.NoError(t, err)
	we.ob = ob
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}},
		Workers:           river.NewWorkers(),
		RetryPolicy:       fastRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	workflow.AddWorker(engine, rc.Workers, &waitWorker{})
	require.NoError(t, engine.Install(rc))
	require.NoError(t, ob.Install(rc))
	require.NoError(t, ob.Register(context.Background()))
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(context.Background())
	require.NoError(t, client.Start(runCtx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	we.client = client
	return we
}

func (we *waitEnv) start(t testing.TB, key string, args waitArgs) {
	t.Helper()
	_, err := workflow.Start(context.Background(), we.client, key, args, nil)
	require.NoError(t, err)
}

// waitingRun waits until the run's wait is committed (its timeout job scheduled) and returns it.
// startFamily starts the run key that starts n children (key/child-0…) and waits for them,
// and returns once the run and every child wait.
func (we *waitEnv) startFamily(t testing.TB, key string, n int) {
	t.Helper()
	we.start(t, key, waitArgs{Mode: "children", TimeoutMS: 600_000, N: n})
	waitingRun(t, we.pool, key)
	for i := range n {
		waitingRun(t, we.pool, fmt.Sprintf("%s/child-%d", key, i))
	}
}

// maintainUntil runs maintenance passes, a few tens of milliseconds apart, until run key is in
// one of statuses, and fails the test after timeout.
func maintainUntil(t testing.TB, we *waitEnv, key string, timeout time.Duration, statuses ...workflow.RunStatus) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		_, err := we.engine.Maintain(context.Background(), we.client)
		require.NoError(t, err)
		run, err := workflow.GetRun(context.Background(), we.pool, key)
		require.NoError(t, err)
		if slices.Contains(statuses, run.Status) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %q is %s after %s of maintenance passes, want one of %v (last error: %s)", key, run.Status, timeout, statuses, deref(run.LastError))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitingRun(t testing.TB, pool *pgxpool.Pool, key string) *workflow.Run {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		run, err := workflow.GetRun(context.Background(), pool, key)
		if err == nil && run.Wait != nil && run.Wait.WokenAt == nil {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %q does not wait after 20s (err %v)", key, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type logged struct {
	woken workflow.Woken
	at    time.Time
}

func waitLog(t testing.TB, pool *pgxpool.Pool, key string, within time.Duration) logged {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var raw []byte
		var l logged
		err := pool.QueryRow(context.Background(), `SELECT woken, at FROM wait_log WHERE run_key = $1`, key).Scan(&raw, &l.at)
		if err == nil {
			require.NoError(t, json.Unmarshal(raw, &l.woken))
			return l
		}
		require.ErrorIs(t, err, pgx.ErrNoRows)
		if time.Now().After(deadline) {
			run, _ := workflow.GetRun(context.Background(), pool, key)
			t.Fatalf("run %q did not take its wait within %s (run: %+v)", key, within, run)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// A signal wakes its waiting run by its commit: measured from the signal's commit to the
// woken step, over 100 waits, each run sleeping (no worker) when the signal is sent.
func TestWaitSignalWakesByCommit(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	const n = 100
	lat := make([]time.Duration, 0, n)
	base := make([]time.Duration, 0, n)
	for i := range n {
		key := fmt.Sprintf("sig-%d", i)
		started := time.Now()
		we.start(t, key, waitArgs{Mode: "signal", TimeoutMS: 600_000})
		run := waitingRun(t, pool, key)
		var first time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT at FROM wait_first WHERE run_key = $1`, key).Scan(&first))
		base = append(base, first.Sub(started))
		require.Equal(t, workflow.WaitSignal, run.Wait.Kind)
		require.Equal(t, `signal "go" not received`, run.Wait.Missing)
		sent := time.Now()
		require.NoError(t, workflow.SignalPool(ctx, pool, key, "go", "id-1", map[string]int{"i": i}))
		l := waitLog(t, pool, key, 10*time.Second)
		lat = append(lat, l.at.Sub(sent))
		require.False(t, l.woken.TimedOut)
		require.NotNil(t, l.woken.Signal)
		require.Equal(t, "id-1", l.woken.Signal.ID)
		require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(l.woken.Signal.Payload))
		waitRun(t, pool, key, 10*time.Second, workflow.RunStatusSucceeded)
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	t.Logf("signal wake latency (signal commit to woken step) over %d waits: p50 %s p99 %s max %s; baseline, River's start to first step in the same process: p50 %s p99 %s",
		n, r(percentile(lat, 0.5)), r(percentile(lat, 0.99)), r(percentile(lat, 1)), r(percentile(base, 0.5)), r(percentile(base, 0.99)))
}

// A signal sent before the run waits is kept and satisfies the wait at once; the same
// signal sent twice with one id counts once (the second wait times out).
func TestWaitSignalBeforeWaitAndDuplicate(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	require.NoError(t, workflow.SignalPool(ctx, pool, "early", "go", "once", "first"))
	require.NoError(t, workflow.SignalPool(ctx, pool, "early", "go", "once", "second"))
	we.start(t, "early", waitArgs{Mode: "signal", TimeoutMS: 600_000})
	l := waitLog(t, pool, "early", 10*time.Second)
	require.NotNil(t, l.woken.Signal)
	require.JSONEq(t, `"first"`, string(l.woken.Signal.Payload))
	waitRun(t, pool, "early", 10*time.Second, workflow.RunStatusSucceeded)

	// The duplicate was stored once and is taken: a second run's wait on the same key is
	// not satisfied by it. (A run key names one run; here the count is read directly.)
	var total, pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE consumed_at IS NULL) FROM stepwise_signal WHERE run_key = 'early'`).Scan(&total, &pending))
	require.Equal(t, 1, total)
	require.Equal(t, 0, pending)
}

// The timeout: no signal comes; the run goes on after its deadline and learns it timed out.
func TestWaitTimeout(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	we.start(t, "late", waitArgs{Mode: "signal", TimeoutMS: 200})
	waitingRun(t, pool, "late")
	// River's scheduler makes the timeout job available (every 5s), as it does a Sleep's.
	l := waitLog(t, pool, "late", 20*time.Second)
	require.True(t, l.woken.TimedOut)
	require.Nil(t, l.woken.Signal)
	waitRun(t, pool, "late", 10*time.Second, workflow.RunStatusSucceeded)
}

// Operations: the run waits, holding no worker, while its operations are out (Run.Wait says
// what is missing), and the commit that records the last outcome wakes it.
func TestWaitOperations(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, false)
	we.start(t, "ops", waitArgs{Mode: "ops", TimeoutMS: 600_000, N: 30, Fail: 3})
	run := waitingRun(t, pool, "ops")
	require.Equal(t, workflow.WaitOperations, run.Wait.Kind)
	require.Equal(t, 30, run.Wait.Operations)
	require.Equal(t, 30, run.Wait.NotAtRest)
	require.Equal(t, "30 of 30 operations not at rest", run.Wait.Missing)
	var leased bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT lease_until IS NOT NULL FROM stepwise_checkpoint WHERE key = 'ops'`).Scan(&leased))
	require.False(t, leased, "a waiting run holds no lease")
	close(we.gate)
	l := waitLog(t, pool, "ops", 20*time.Second)
	require.False(t, l.woken.TimedOut)
	require.Equal(t, map[string]int{"SUCCEEDED": 27, "FAILED_PERMANENT": 3}, l.woken.Operations)
	waitRun(t, pool, "ops", 10*time.Second, workflow.RunStatusSucceeded)
}

// Children: the step starts them in its own transaction and waits; the last child's finish
// wakes the parent, which learns each child's status.
func TestWaitChildren(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	we.start(t, "parent", waitArgs{Mode: "children", TimeoutMS: 600_000, N: 3})
	run := waitingRun(t, pool, "parent")
	require.Equal(t, "3 of 3 child runs unfinished", run.Wait.Missing)
	for i := range 3 {
		child := fmt.Sprintf("parent/child-%d", i)
		cr := waitingRun(t, pool, child)
		require.Equal(t, "parent", *cr.Parent)
		require.NoError(t, workflow.SignalPool(ctx, pool, child, "go", "x", nil))
		waitRun(t, pool, child, 10*time.Second, workflow.RunStatusSucceeded)
		if i < 2 {
			run, err := workflow.GetRun(ctx, pool, "parent")
			require.NoError(t, err)
			require.NotNil(t, run.Wait)
			require.Nil(t, run.Wait.WokenAt, "woken before its last child finished")
		}
	}
	l := waitLog(t, pool, "parent", 10*time.Second)
	require.False(t, l.woken.TimedOut)
	require.Len(t, l.woken.Children, 3)
	for _, st := range l.woken.Children {
		require.Equal(t, workflow.RunStatusSucceeded, st)
	}
	waitRun(t, pool, "parent", 10*time.Second, workflow.RunStatusSucceeded)
}

// Cancelling a parent reaches its children; resuming it resumes them.
func TestWaitCancelAndResumeReachChildren(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	we.startFamily(t, "cp", 2)
	require.NoError(t, workflow.CancelRun(ctx, pool, "cp", "test: stop the batch"))
	// Nobody works a waiting run: one maintenance pass ends it and its children as cancelled.
	// After a first start, a run seen waiting has committed its wait, and with it released its
	// lease and made the wait's scheduled timeout job its job, all that pass asks for. (After a
	// resume it is not so: see the second round below.)
	res, err := we.engine.Maintain(ctx, we.client)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"cp", "cp/child-0", "cp/child-1"}, res.Cancelled, "one pass ends the waiting family")
	for _, k := range []string{"cp", "cp/child-0", "cp/child-1"} {
		r := waitRun(t, pool, k, 0, workflow.RunStatusCancelled)
		if k != "cp" {
			require.Contains(t, deref(r.LastError), "cancelled with its parent run cp")
		}
	}
	require.NoError(t, resumeNow(ctx, we.pool, we.client, "cp", "tester", "test: go on"))
	for i := range 2 {
		waitingRun(t, pool, fmt.Sprintf("cp/child-%d", i))
	}
	// A second round: cancelled again with its children (who end after it), it resumes
	// again: a cancellation that came with the parent's is not news about a child.
	require.NoError(t, workflow.CancelRun(ctx, pool, "cp", "test: stop the batch again"))
	// Maintenance passes as the client runs them (every MaintenanceInterval, a second by
	// default), not once: the resumed parent may still be in its step when the cancel lands,
	// and commit its wait after a single pass has looked (CI saw it: "cp" still running after
	// 10 s). A waiting run is ended by the next pass.
	for _, k := range []string{"cp", "cp/child-0", "cp/child-1"} {
		maintainUntil(t, we, k, 10*time.Second, workflow.RunStatusCancelled)
	}
	require.NoError(t, resumeNow(ctx, we.pool, we.client, "cp", "tester", "test: go on again"))
	for i := range 2 {
		child := fmt.Sprintf("cp/child-%d", i)
		waitingRun(t, pool, child)
		require.NoError(t, workflow.SignalPool(ctx, pool, child, "go", "x", nil))
	}
	for i := range 2 {
		waitRun(t, pool, fmt.Sprintf("cp/child-%d", i), 10*time.Second, workflow.RunStatusSucceeded)
	}
	l := waitLog(t, pool, "cp", 20*time.Second)
	require.False(t, l.woken.TimedOut)
	waitRun(t, pool, "cp", 10*time.Second, workflow.RunStatusSucceeded)
}

// A child resumed on its own after its parent ended, and cancelled (or failed) again, is news
// the person who read the parent has not seen: resuming the parent at the version they saw
// resumes the parent and its other child, leaves that one as it is and says so in the
// parent's resume event. Children resumed with the parent record the parent's version.
func TestResumeOfAParentLeavesAChildThatChangedOnItsOwn(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	we.startFamily(t, "ab", 2)
	// Maintenance passes as the client runs them, not once: a run just resumed may still be
	// in its step, holding its lease, when the cancel lands (waitingRun sees the wait row kept
	// from before the cancel), and a single pass then leaves it for the next (CI saw it under
	// load: "ab/child-0" still running after 10 s).
	cancelAll := func(key, reason string) {
		t.Helper()
		require.NoError(t, workflow.CancelRun(ctx, pool, key, reason))
		maintainUntil(t, we, key, 10*time.Second, workflow.RunStatusCancelled)
	}
	cancelAll("ab", "INC-1: the bank is down")
	for i := range 2 {
		maintainUntil(t, we, fmt.Sprintf("ab/child-%d", i), 10*time.Second, workflow.RunStatusCancelled)
	}
	// Alice reads the parent: cancelled, with its two children.
	seen, err := workflow.GetRun(ctx, pool, "ab")
	require.NoError(t, err)

	// Meanwhile Bob retries child 0 alone; it is stopped again, for another reason.
	require.NoError(t, resumeNow(ctx, pool, we.client, "ab/child-0", "bob", "INC-1: try EUR alone"))
	waitingRun(t, pool, "ab/child-0")
	cancelAll("ab/child-0", "acct-9 frozen by compliance")
	frozen, err := workflow.GetRun(ctx, pool, "ab/child-0")
	require.NoError(t, err)

	var returned []string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		returned, err = workflow.ResumeTx(ctx, we.client, tx, "ab", seen.Version, "alice", "INC-1: the bank is back")
		return err
	}))
	require.Equal(t, []string{"ab/child-0"}, returned, "the resume returns what it left, for the person to see at once")
	left, err := workflow.GetRun(ctx, pool, "ab/child-0")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusCancelled, left.Status, "the child that changed after its parent ended is left as it is")
	require.Equal(t, frozen.Version, left.Version)
	var leftList []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array(SELECT jsonb_array_elements_text(detail->'left_as_they_are'))
		FROM stepwise_event WHERE subject = 'ab' AND kind = 'run.resume' ORDER BY id DESC LIMIT 1`).Scan(&leftList))
	require.Equal(t, []string{"ab/child-0"}, leftList, "the parent's resume says what it left")
	var withParent string
	var parentSeen int64
	var ownSeen *int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT detail->>'with_parent', (detail->>'parent_seen_version')::bigint, (detail->>'seen_version')::bigint
		FROM stepwise_event WHERE subject = 'ab/child-1' AND kind = 'run.resume' ORDER BY id DESC LIMIT 1`).Scan(&withParent, &parentSeen, &ownSeen))
	require.Equal(t, "ab", withParent)
	require.Equal(t, seen.Version, parentSeen, "a child resumed with its parent records the version the person saw: the parent's")
	require.Nil(t, ownSeen, "and no version of its own, which nobody saw")
	waitingRun(t, pool, "ab/child-1")
	require.NoError(t, workflow.SignalPool(ctx, pool, "ab/child-1", "go", "x", nil))
	waitRun(t, pool, "ab", 20*time.Second, workflow.RunStatusSucceeded)
	left, err = workflow.GetRun(ctx, pool, "ab/child-0")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusCancelled, left.Status, "nobody decided on it: still as it was")
}

// A child resumed on its own before its parent ended, and stopped again after: the parent's
// end does not show it, so resuming the parent at the version seen leaves it as it is, and
// resumes the child cancelled with the parent.
func TestResumeOfAParentLeavesAChildThatStoppedAfterTheParentEnded(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	we.startFamily(t, "hb", 2)
	// Maintenance passes as the client runs them, not once (see
	// TestResumeOfAParentLeavesAChildThatChangedOnItsOwn).
	// Carol holds EUR; Alice stops the batch; Bob lets EUR go on before the batch has ended.
	require.NoError(t, workflow.CancelRun(ctx, pool, "hb/child-0", "carol: hold EUR"))
	maintainUntil(t, we, "hb/child-0", 10*time.Second, workflow.RunStatusCancelled)
	require.NoError(t, workflow.CancelRun(ctx, pool, "hb", "INC-1: the bank is down"))
	require.NoError(t, resumeNow(ctx, pool, we.client, "hb/child-0", "bob", "EUR is fine"))
	waitingRun(t, pool, "hb/child-0")
	maintainUntil(t, we, "hb", 10*time.Second, workflow.RunStatusCancelled)
	maintainUntil(t, we, "hb/child-1", 10*time.Second, workflow.RunStatusCancelled)
	// The passes left Bob's EUR alone: it waits, asked to stop by nobody.
	live := waitingRun(t, pool, "hb/child-0")
	require.Equal(t, workflow.RunStatusRunning, live.Status)
	var cancelAsked bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT cancel_requested_at IS NOT NULL FROM stepwise_run WHERE key = 'hb/child-0'`).Scan(&cancelAsked))
	require.False(t, cancelAsked, "the parent's cancel does not reach a child resumed after it")
	seen, err := workflow.GetRun(ctx, pool, "hb")
	require.NoError(t, err)
	// After Alice read the batch, EUR is stopped again, for another reason.
	require.NoError(t, workflow.CancelRun(ctx, pool, "hb/child-0", "acct-9 frozen by compliance"))
	maintainUntil(t, we, "hb/child-0", 10*time.Second, workflow.RunStatusCancelled)

	require.NoError(t, resumeSeen(ctx, pool, we.client, "hb", seen.Version, "alice", "INC-1: the bank is back"))
	r0, err := workflow.GetRun(ctx, pool, "hb/child-0")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusCancelled, r0.Status, "stopped after the batch ended: left as it is")
	waitingRun(t, pool, "hb/child-1") // cancelled with the batch: resumed with it
	// Alice then decides on EUR on its own, at the version she reads.
	require.NoError(t, resumeNow(ctx, pool, we.client, "hb/child-0", "alice", "INC-2: compliance released acct-9"))
	for i := range 2 {
		child := fmt.Sprintf("hb/child-%d", i)
		waitingRun(t, pool, child)
		require.NoError(t, workflow.SignalPool(ctx, pool, child, "go", "x", nil))
	}
	waitRun(t, pool, "hb", 20*time.Second, workflow.RunStatusSucceeded)
}

// A descendant left as it is keeps every run below it, whatever the status of the runs in
// between: a failed grandchild under a succeeded child of a left child is not re-run.
func TestResumeOfAParentLeavesTheWholeSubtreeOfANewsDescendant(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) VALUES ('p'), ('p/c'), ('p/c/e'), ('p/c/e/d'), ('p/k');
		INSERT INTO stepwise_run (key, workflow, input, status, parent_key, finished_at) VALUES
			('p', 'test_wait', '{"mode": "signal", "timeout_ms": 600000}', 'cancelled', NULL, now() - interval '1 hour'),
			('p/c', 'test_wait', '{}', 'failed', 'p', now()),
			('p/c/e', 'test_wait', '{}', 'succeeded', 'p/c', now() - interval '3 hours'),
			('p/c/e/d', 'test_wait', '{}', 'failed', 'p/c/e', now() - interval '2 hours'),
			('p/k', 'test_wait', '{}', 'failed', 'p', now() - interval '2 hours')`)
	require.NoError(t, err)
	seen, err := workflow.GetRun(ctx, pool, "p")
	require.NoError(t, err)
	require.NoError(t, resumeSeen(ctx, pool, we.client, "p", seen.Version, "alice", "INC-1: the bank is back"))
	for k, want := range map[string]workflow.RunStatus{"p/c": workflow.RunStatusFailed, "p/c/e/d": workflow.RunStatusFailed} {
		r, err := workflow.GetRun(ctx, pool, k)
		require.NoError(t, err)
		require.Equal(t, want, r.Status, "%s is left as it is", k)
	}
	var resumed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE subject = 'p/k' AND kind = 'run.resume' AND detail->>'with_parent' = 'p'`).Scan(&resumed))
	require.Equal(t, 1, resumed, "the child that failed before the parent ended is resumed with it")
	var left []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array(SELECT jsonb_array_elements_text(detail->'left_as_they_are'))
		FROM stepwise_event WHERE subject = 'p' AND kind = 'run.resume'`).Scan(&left))
	require.Equal(t, []string{"p/c", "p/c/e/d"}, left)
}

// The backstop: a satisfier that does not know waits (an UPDATE by hand, an older binary)
// satisfies the condition without waking the run; maintenance wakes it. And a wake whose
// job was lost (rescheduled far out by hand) is woken again.
func TestWaitMaintenanceBackstop(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, false)
	ctx := context.Background()
	// The engine's maintenance runs once on start, on River's leader: on a loaded machine
	// the election can put that pass inside the window below, where it would wake the run
	// on the signal written by hand (the backstop doing its work, early) and the test would
	// find the wait gone. Let that pass end first; the next is an hour away.
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_maintenance' AND state = 'completed'`).Scan(&n)
		return err == nil && n > 0
	}, time.Minute, 10*time.Millisecond, "the engine's start-up maintenance pass never ran")
	we.start(t, "lost", waitArgs{Mode: "signal", TimeoutMS: 600_000})
	waitingRun(t, pool, "lost")
	// The signal's row, written without workflow.Signal: no wake.
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_signal (run_key, name, signal_id, payload) VALUES ('lost', 'go', 'by-hand', '1')`)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	run, err := workflow.GetRun(ctx, pool, "lost")
	require.NoError(t, err)
	require.NotNil(t, run.Wait, "the run no longer waits: something woke it")
	require.Nil(t, run.Wait.WokenAt, "nothing woke it yet")
	res, err := we.engine.Maintain(ctx, we.client)
	require.NoError(t, err)
	require.Equal(t, []string{"lost"}, res.Woken)
	l := waitLog(t, pool, "lost", 10*time.Second)
	require.JSONEq(t, `1`, string(l.woken.Signal.Payload))

	// A woken wait whose wake job is lost: marked woken, but its job pushed an hour out.
	we.start(t, "lost2", waitArgs{Mode: "signal", TimeoutMS: 600_000})
	waitingRun(t, pool, "lost2")
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_signal (run_key, name, signal_id, payload) VALUES ('lost2', 'go', 'by-hand', '2')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE stepwise_wait SET woken_at = now() - interval '1 minute', woken_by = 'test' WHERE run_key = 'lost2'`)
	require.NoError(t, err)
	res, err = we.engine.Maintain(ctx, we.client)
	require.NoError(t, err)
	require.Equal(t, []string{"lost2"}, res.Woken)
	waitLog(t, pool, "lost2", 10*time.Second)
}

// countingTracer counts the statements a pool runs.
type countingTracer struct {
	mu sync.Mutex
	n  int
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// The cost of waiting: 10,000 waiting runs (timeout jobs scheduled, their operations out)
// cost a maintenance pass a bounded number of statements, the same as with none, and the
// backstop's scans use their indexes.
func TestWaitMaintenanceCost(t *testing.T) {
	ctx := context.Background()
	url := testkit.DBURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 4
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := newEnv(t, pool, &workflow.Config{Lease: 30 * time.Second}, nil, map[string]river.QueueConfig{})

	pass := func() (time.Duration, int) {
		before := tracer.count()
		start := time.Now()
		_, err := e.engine.Maintain(ctx, e.client)
		require.NoError(t, err)
		return time.Since(start), tracer.count() - before
	}
	_, _ = pass()
	_, emptyStatements := pass()
	var empty []time.Duration
	for range 30 {
		d, _ := pass()
		empty = append(empty, d)
	}

	const n = 10_000
	started := time.Now()
	seedWaitingRuns(t, pool, n)
	t.Logf("seeded %d waiting runs (3 operations each) in %s", n, time.Since(started).Round(time.Millisecond))

	var ds []time.Duration
	statements := 0
	for range 30 {
		d, s := pass()
		ds = append(ds, d)
		statements = max(statements, s)
	}
	t.Logf("maintenance pass with %d waiting runs: p50 %s max %s (with no runs, same process: p50 %s); statements a pass: %d (with no runs: %d)",
		n, percentile(ds, 0.5).Round(10*time.Microsecond), percentile(ds, 1).Round(10*time.Microsecond),
		percentile(empty, 0.5).Round(10*time.Microsecond), statements, emptyStatements)
	var bs []time.Duration
	for range 30 {
		start := time.Now()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, _, err := runwait.Backstop(ctx, tx, "", 100, 60_000)
			return err
		}))
		bs = append(bs, time.Since(start))
	}
	t.Logf("the backstop alone (a page of 100 of the %d waits checked): p50 %s", n, percentile(bs, 0.5).Round(10*time.Microsecond))
	// A pass's statements do not grow with the waiting runs (no statement per run): the
	// backstop adds its fixed handful (a transaction, two scans, a page).
	require.LessOrEqual(t, statements, emptyStatements+6)

	for _, q := range []string{
		`EXPLAIN SELECT w.run_key FROM stepwise_wait w JOIN stepwise_run r ON r.key = w.run_key AND r.status IN ('pending', 'running')
		  JOIN river_job j ON j.id = r.river_job_id AND j.state = 'scheduled'
		 WHERE w.woken_at IS NOT NULL AND w.woken_at < now() - interval '1 minute' AND j.scheduled_at > now() + interval '1 minute' LIMIT 100`,
		`EXPLAIN SELECT max(run_key), count(*)::int FROM (SELECT run_key FROM stepwise_wait WHERE woken_at IS NULL AND run_key > '' ORDER BY run_key LIMIT 100) p`,
	} {
		rows, err := pool.Query(ctx, q)
		require.NoError(t, err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		joined := fmt.Sprint(plan)
		t.Logf("plan:\n%s", joined)
		require.Contains(t, joined, "Index")
	}
}

// MANUAL counts as at rest only once a person resolved it: the run stays asleep while one
// operation is MANUAL (Run.Wait says so), and the person's decision, recorded through the
// reconciler, wakes it in the decision's transaction.
func TestWaitOperationsManualUntilResolved(t *testing.T) {
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, true)
	ctx := context.Background()
	we.start(t, "man", waitArgs{Mode: "ops", TimeoutMS: 600_000, N: 5, Manual: 1})
	waitingRun(t, pool, "man")
	deadline := time.Now().Add(20 * time.Second)
	var run *workflow.Run
	for {
		var err error
		run, err = workflow.GetRun(ctx, pool, "man")
		require.NoError(t, err)
		if run.Wait != nil && run.Wait.Manual == 1 && run.Wait.NotAtRest == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "operations did not settle: %+v", run.Wait)
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, "1 of 5 operations not at rest; 1 MANUAL", run.Wait.Missing)
	time.Sleep(300 * time.Millisecond)
	run, err := workflow.GetRun(ctx, pool, "man")
	require.NoError(t, err)
	require.Nil(t, run.Wait.WokenAt, "woken while an operation is MANUAL")

	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: we.ob, Logger: quietLogger(), Kinds: map[string]*reconcile.KindConfig{
		waitOpKind: {Checker: reconcile.CheckerFunc(func(context.Context, *outbox.Operation) (reconcile.LookupResult, error) {
			return reconcile.LookupResult{}, errors.New("not used")
		})},
	}})
	require.NoError(t, err)
	_, err = rec.Resolve(ctx, &reconcile.ResolveOpts{OperationID: outbox.OperationID(waitOpKind, "man/0/manual"),
		Outcome: outbox.StateFailedPermanent, ExpectedState: outbox.StateManual, Actor: "tester", Reason: "test: never sent"})
	require.NoError(t, err)
	l := waitLog(t, pool, "man", 10*time.Second)
	require.False(t, l.woken.TimedOut)
	require.Equal(t, map[string]int{"SUCCEEDED": 4, "FAILED_PERMANENT": 1}, l.woken.Operations)
}

// "Retry now" (River's JobRetry, as River's UI offers it) on the timeout job of a wait whose
// condition holds but woke no one (a signal written by hand) takes the wait at once: the step
// after a wait checks the condition itself, so an early job is safe there. The guard that
// holds a Sleep to its wake time (stepWorker.work) first snoozed it back to the wait's
// deadline, ten minutes out (found in review).
func TestRetryNowOnAWaitWhoseConditionHolds(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	we := newWaitEnv(t, pool, false)
	ctx := context.Background()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_maintenance' AND state = 'completed'`).Scan(&n)
		return err == nil && n > 0
	}, time.Minute, 10*time.Millisecond, "the engine's start-up maintenance pass never ran")
	we.start(t, "nudged", waitArgs{Mode: "signal", TimeoutMS: 600_000})
	run := waitingRun(t, pool, "nudged")
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_signal (run_key, name, signal_id, payload) VALUES ('nudged', 'go', 'by-hand', '7')`)
	require.NoError(t, err)
	_, err = we.client.JobRetry(ctx, *run.RiverJobID)
	require.NoError(t, err)
	requireWaitLogged(t, pool, "nudged", 30*time.Second)
}

// requireWaitLogged waits until the run's step after its wait has logged, or fails naming
// where the run and its job are.
func requireWaitLogged(t *testing.T, pool *pgxpool.Pool, key string, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM wait_log WHERE run_key = $1`, key).Scan(&n))
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			run, err := workflow.GetRun(ctx, pool, key)
			require.NoError(t, err)
			var state string
			var dueIn time.Duration
			require.NoError(t, pool.QueryRow(ctx, `SELECT state::text, (extract(epoch FROM scheduled_at - now()) * 1e9)::bigint FROM river_job WHERE id = $1`,
				*run.RiverJobID).Scan(&state, &dueIn))
			t.Fatalf("the step after the wait never ran within %s: run %s, wake_at %v, job %d %s due in %s", within, run.Status, run.WakeAt,
				*run.RiverJobID, state, dueIn.Round(time.Second))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
