package workflow_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// These tests run workers as real subprocesses of this test binary and stop them with real
// signals: kill -9 (a crash), SIGSTOP/SIGCONT (a frozen process: GC pause, VM migration).
// Takeover is driven by a maintenance loop in this process, as River's leader would.

var stepLine = regexp.MustCompile(`step run=(\S+) n=(\d+) cursor=(\d+) pid=(\d+) token=(\d+)`)

func startRun(t *testing.T, e *env, key string, args countArgs) {
	t.Helper()
	_, err := workflow.Start(context.Background(), e.client, key, args, &workflow.StartOpts{
		InsertOpts: &river.InsertOpts{Queue: "wf", MaxAttempts: 100},
	})
	require.NoError(t, err)
}

func workerEnv(url string, lease, stall time.Duration, extra ...string) []string {
	return append([]string{
		"STEPWISE_TEST_DB=" + url,
		fmt.Sprintf("LEASE_MS=%d", lease.Milliseconds()),
		fmt.Sprintf("STALL_MS=%d", stall.Milliseconds()),
	}, extra...)
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func claimTokens(t *testing.T, e *env, key string) []int64 {
	rows, err := e.pool.Query(context.Background(), `SELECT token FROM stepwise_event WHERE subject = $1 AND kind = 'lease.claim' ORDER BY id`, key)
	require.NoError(t, err)
	tokens, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return tokens
}

func requireStrictlyIncreasing(t *testing.T, tokens []int64) {
	t.Helper()
	require.NotEmpty(t, tokens)
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "claim tokens must strictly increase: %v", tokens)
	}
}

// Drill 3: a worker frozen mid-step past its lease; another takes over and advances; the
// frozen one wakes and tries to commit. The fence refuses it and none of its rows land. The
// stall timeout is set long here so the fence, not the server's idle timeout, is what stops
// it; the business table has no unique key, so only the fence can prevent duplicates.
func TestZombieCommitIsFenced(t *testing.T) {
	t.Parallel()
	url := testkit.DBURL(t)
	e := newEnv(t, mustPool(t, url), &workflow.Config{Lease: time.Second}, nil, map[string]river.QueueConfig{})
	createItems(t, e.pool, "plain_items", false)
	maintainLoop(t, e, 200*time.Millisecond)
	const lease = time.Second

	zombie := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, time.Minute, "STOP_AT_STEP=3")...)
	_, err := zombie.WaitForLine(waitCtx(t, 20*time.Second), "ready")
	require.NoError(t, err)
	startRun(t, e, "zombie", countArgs{Total: 200, Batch: 20, Table: "plain_items"})
	_, err = zombie.WaitForLine(waitCtx(t, 20*time.Second), "pausing run=zombie step=3")
	require.NoError(t, err)
	// The zombie is now SIGSTOPped with step 3's rows written but not committed.

	rescuer := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, time.Minute)...)
	run := waitRun(t, e.pool, "zombie", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)

	zombie.Cont()
	_, err = zombie.WaitForLine(waitCtx(t, 20*time.Second), "commit refused")
	require.NoError(t, err)
	rescuer.Kill()
	zombie.Kill()

	perN, perPid := itemCounts(t, e.pool, "plain_items", "zombie")
	requireExactlyOnce(t, perN, 200)
	require.Zero(t, perPid[zombie.Pid()]-40, "only the zombie's two committed steps (40 rows) are its own; step 3 never landed")
	var fenced int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM stepwise_event
		WHERE subject = 'zombie' AND kind = 'lease.fenced' AND actor LIKE '%/attempt-%'`).Scan(&fenced))
	require.Equal(t, 1, fenced, "the refused commit is in the audit trail")
	requireStrictlyIncreasing(t, claimTokens(t, e, "zombie"))
}

// A worker frozen inside a step while its uncommitted rows hold a unique business key: the
// server's stall timeout (about the lease) ends its transaction, freeing the key, so the
// worker that takes over is not blocked behind it; the woken worker commits nothing.
func TestStalledStepIsKilledByServer(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 200*time.Millisecond)

	stalled := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, "STOP_AT_STEP=2")...)
	_, err := stalled.WaitForLine(waitCtx(t, 20*time.Second), "ready")
	require.NoError(t, err)
	startRun(t, e, "stall", countArgs{Total: 100, Batch: 10, Table: "items"})
	_, err = stalled.WaitForLine(waitCtx(t, 20*time.Second), "pausing run=stall step=2")
	require.NoError(t, err)

	started := time.Now()
	rescuer := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease)...)
	run := waitRun(t, e.pool, "stall", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	t.Logf("run finished %s after the stall began (lease %s)", time.Since(started).Round(time.Millisecond), lease)

	// The server ends the frozen transaction StallTimeout (the lease, 1 s) after it went
	// idle. The rescuer may finish the run first (it needs the lease to lapse, not the
	// transaction to end: a test beside a CPU hog saw it do so), so this waits for the
	// server's timer, which a loaded machine delays, rather than reading it once.
	require.Eventually(t, func() bool {
		var stalledTx int
		// The frozen step's transaction, by its last statement (the step's INSERT): the
		// frozen process's other connections (River's, the maintenance loop's) may sit idle
		// in a transaction of theirs too when SIGSTOP lands, and the server's stall timeout
		// is the step transaction's alone.
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'
			  AND query LIKE 'INSERT INTO %'`).Scan(&stalledTx)
		return err == nil && stalledTx == 0
	}, 30*time.Second, 50*time.Millisecond, "the server ended the frozen transaction")

	stalled.Cont()
	time.Sleep(500 * time.Millisecond) // let the woken worker try whatever it would
	rescuer.Kill()
	stalled.Kill()
	perN, perPid := itemCounts(t, e.pool, "items", "stall")
	requireExactlyOnce(t, perN, 100)
	require.Equal(t, 10, perPid[stalled.Pid()], "only the stalled worker's first, committed step is its own")
}

// Crash resume: kill -9 the worker mid-run several times at random moments, start a new one
// each time. Every item is processed exactly once, and each new worker starts from the last
// committed cursor, not from zero. Also measures takeover time after kill -9.
func TestKill9ResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	url, e := processEnv(t, lease, time.Second)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))

	const total = 3000
	startRun(t, e, "crashy", countArgs{Total: total, Batch: 25, Table: "items"})
	extra := []string{"STEP_SLEEP=15ms"}

	// A standby worker is always running beside the active one, so takeover time is
	// lease expiry + maintenance + River fetch, not process start-up.
	active := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, extra...)...)
	standby := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, extra...)...)
	var takeovers []time.Duration
	var resumedAt []int
	for kill := 0; kill < 4; kill++ {
		// Find who is working the run now.
		line, err := firstStepLine(t, []*workflowtest.Process{active, standby})
		require.NoError(t, err)
		m := stepLine.FindStringSubmatch(line)
		pid, _ := strconv.Atoi(m[4])
		if standby.Pid() == pid {
			active, standby = standby, active
		}
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		st, err := e.engine.Checkpoints().Get(context.Background(), "crashy")
		require.NoError(t, err)
		if st.Owner == nil {
			break // finished early
		}
		active.Kill()
		killedAt := time.Now()
		line, err = standby.WaitForLine(waitCtx(t, 30*time.Second), "step run=crashy")
		require.NoError(t, err)
		takeovers = append(takeovers, time.Since(killedAt))
		m = stepLine.FindStringSubmatch(line)
		cursor, _ := strconv.Atoi(m[3])
		resumedAt = append(resumedAt, cursor)
		// The resumed cursor is the committed one: greater than zero, and no more than
		// one step behind what the killed worker had reached.
		require.Greater(t, cursor, 0, "resumed from zero instead of the checkpoint")
		active, standby = standby, workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, extra...)...)
	}
	run := waitRun(t, e.pool, "crashy", 60*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	perN, _ := itemCounts(t, e.pool, "items", "crashy")
	requireExactlyOnce(t, perN, total)
	requireStrictlyIncreasing(t, claimTokens(t, e, "crashy"))

	sorted := append([]time.Duration(nil), takeovers...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	t.Logf("kill -9 x%d, resumed at cursors %v; takeover after kill: %v (median %s, max %s; lease %s, target lease+2s)",
		len(takeovers), resumedAt, takeovers, sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), lease)
	require.NotEmpty(t, takeovers)
	require.Less(t, sorted[len(sorted)-1], lease+5*time.Second, "takeover far slower than lease + maintenance interval")
}

func firstStepLine(t *testing.T, procs []*workflowtest.Process) (string, error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range procs {
			lines := p.Lines()
			for i := len(lines) - 1; i >= 0; i-- {
				if stepLine.MatchString(lines[i]) {
					return lines[i], nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("no worker printed a step line")
}
