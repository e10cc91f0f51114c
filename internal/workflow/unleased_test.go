package workflow_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// delayFirstWork is River worker middleware that holds the first job it is handed for d
// before the worker sees it: a live process, starved between River's fetch (which marks the
// job running, attempted_at) and the step worker's claim.
type delayFirstWork struct {
	river.MiddlewareDefaults
	d       time.Duration
	delayed atomic.Bool
	// held, when not nil, is closed as the hold begins (the job is fetched, not claimed).
	held chan struct{}
}

func (m *delayFirstWork) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	// Only the run's job: the engine's maintenance job shares the queue and may be fetched
	// first, and holding it would leave the run undelayed and the test proving nothing.
	if job.Kind == (countArgs{}).Kind() && m.delayed.CompareAndSwap(false, true) {
		if m.held != nil {
			close(m.held)
		}
		select {
		case <-time.After(m.d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return doInner(ctx)
}

// slowClaimEnv starts a River client working countWorker runs at lease, whose first run job
// is held 1.6 s between River's fetch and the worker's claim, with maintenance every 100 ms.
func slowClaimEnv(t *testing.T, pool *pgxpool.Pool, lease time.Duration) (*env, *delayFirstWork) {
	t.Helper()
	return slowClaimEnvWith(t, pool, lease, &delayFirstWork{d: 1600 * time.Millisecond})
}

func slowClaimEnvWith(t *testing.T, pool *pgxpool.Pool, lease time.Duration, delay *delayFirstWork) (*env, *delayFirstWork) {
	t.Helper()
	engine, err := workflow.New(pool, &workflow.Config{Lease: lease, Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, &countWorker{})
	e := newEnvWith(t, pool, engine, workers, delay)
	maintainLoop(t, e, 100*time.Millisecond)
	return e, delay
}

// A live worker slow between River's fetch and its claim holds no lease, and nothing renews
// that state: maintenance must leave it two Leases before it calls the worker vanished. With
// one (the rule before), a worker starved for 1.6 s at a 1 s Lease was taken over while alive
// — the needless takeover the chaos long profile met beside a CPU hog (2.35 s at 2 s).
func TestSlowClaimAfterFetchIsNotTakenOver(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	pool := mustPool(t, testkit.DBURL(t))
	createItems(t, pool, "items", true)
	e, delay := slowClaimEnv(t, pool, lease)

	ctx := context.Background()
	_, err := workflow.Start(ctx, e.client, "slowclaim", countArgs{Total: 30, Batch: 10, Table: "items"}, nil)
	require.NoError(t, err)
	run := waitRun(t, pool, "slowclaim", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.True(t, delay.delayed.Load(), "the middleware never held the run's job")
	// The claim came more than a Lease after River's fetch: the state the old rule took over.
	var fetchToClaim time.Duration
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT min(at) FROM stepwise_event WHERE subject = 'slowclaim' AND kind = 'lease.claim')
		- (SELECT attempted_at FROM river_job WHERE kind = $1 ORDER BY id LIMIT 1)`, (countArgs{}).Kind()).Scan(&fetchToClaim))
	require.Greater(t, fetchToClaim, lease, "the claim was not delayed past a lease after the fetch")
	t.Logf("fetch to claim: %s (Lease %s)", fetchToClaim.Round(time.Millisecond), lease)
	takeovers := queryInt(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'slowclaim' AND kind = 'run.takeover'`)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))
	require.Zero(t, takeovers, "a live worker was taken over between River's fetch and its claim")
	require.Zero(t, run.Failures)
	require.Equal(t, 1, run.Attempts, "the run was claimed once, by the worker River handed it to")
	perN, _ := itemCounts(t, pool, "items", "slowclaim")
	requireExactlyOnce(t, perN, 30)
}

// The same starved fetcher, on a run that was taken over before: the takeover leaves the dead
// holder's lapsed lease on the checkpoint until the next claim, and the rule before judged the
// new job by that lease, with one Lease (a lease counts only when taken after the job's
// fetch). A live worker starved 1.6 s between fetch and claim at a 1 s Lease was taken over a
// second time, one takeover after the other, while it was alive.
func TestSlowClaimAfterTakeoverIsNotTakenOverAgain(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	pool := mustPool(t, testkit.DBURL(t))
	createItems(t, pool, "items", true)
	cfg := &workflow.Config{Lease: lease}
	insertOnly := newEnv(t, pool, cfg, nil, map[string]river.QueueConfig{})
	ctx := context.Background()
	_, err := workflow.Start(ctx, insertOnly.client, "retaken", countArgs{Total: 30, Batch: 10, Table: "items"}, nil)
	require.NoError(t, err)
	// A worker claimed the run an hour ago and died: its lease lapsed, its job still 'running'.
	fakeAttempt(t, insertOnly, "retaken")

	// The first job this client works is the takeover's: held 1.6 s between fetch and claim.
	_, delay := slowClaimEnv(t, pool, lease)

	run := waitRun(t, pool, "retaken", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.True(t, delay.delayed.Load(), "the middleware never held the run's job")
	var fetchToClaim time.Duration
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT min(at) FROM stepwise_event WHERE subject = 'retaken' AND kind = 'lease.claim' AND actor NOT LIKE $2 || '/%')
		- (SELECT attempted_at FROM river_job WHERE kind = $1 AND id <> (SELECT min(id) FROM river_job WHERE kind = $1) ORDER BY id LIMIT 1)`,
		(countArgs{}).Kind(), stalledClient).Scan(&fetchToClaim))
	t.Logf("takeover job: fetch to claim %s (Lease %s)", fetchToClaim.Round(time.Millisecond), lease)
	require.Greater(t, fetchToClaim, lease, "the takeover job's claim was not delayed past a lease after its fetch")
	takeovers := queryInt(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'retaken' AND kind = 'run.takeover'`)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))
	require.Equal(t, 1, takeovers, "the live worker of the takeover's job was taken over again between fetch and claim")
	perN, _ := itemCounts(t, pool, "items", "retaken")
	requireExactlyOnce(t, perN, 30)
}

// A double fault: the holder of a run is frozen and taken over; before the takeover's job is
// claimed, the old holder thaws long enough for its heartbeat to renew (a takeover moves the
// run's job, not the checkpoint's token, so the renewal holds) and freezes again. Its renewed
// lease then lapses while the takeover's worker, alive, is still starved between fetch and
// claim. The rule before counted any lease that outlived the fetch as the new job's own and
// took the live fetcher over after one Lease; a lease counts as the job's only when its owner
// names the job's attempt, so this job is the unleased scan's, with two Leases.
func TestThawedHolderRenewalIsNotTheFetchersLease(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	pool := mustPool(t, testkit.DBURL(t))
	createItems(t, pool, "items", true)
	insertOnly := newEnv(t, pool, &workflow.Config{Lease: lease}, nil, map[string]river.QueueConfig{})
	ctx := context.Background()
	_, err := workflow.Start(ctx, insertOnly.client, "thawed", countArgs{Total: 30, Batch: 10, Table: "items"}, nil)
	require.NoError(t, err)
	run, err := workflow.GetRun(ctx, pool, "thawed")
	require.NoError(t, err)
	// The holder: its job fetched 1.5 Leases ago by a River client and claimed under the
	// owner its worker writes, then frozen past its lease: the expired scan's, on the first
	// pass.
	oldJob := *run.RiverJobID
	oldOwner := workflow.OwnerForTest(stalledClient, oldJob, 1)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '1500 milliseconds',
		attempted_by = ARRAY[$2::text] WHERE id = $1`, oldJob, stalledClient)
	require.NoError(t, err)
	old, err := insertOnly.engine.Checkpoints().Claim(ctx, "thawed", oldOwner, 1)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE stepwise_run SET status = 'running', attempts = attempts + 1 WHERE key = 'thawed'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE stepwise_checkpoint SET lease_until = now() - interval '100 milliseconds' WHERE key = 'thawed'`)
	require.NoError(t, err)

	delay := &delayFirstWork{d: 1600 * time.Millisecond, held: make(chan struct{})}
	slowClaimEnvWith(t, pool, lease, delay)
	select {
	case <-delay.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the takeover's job was never fetched")
	}
	// The holder thaws: its heartbeat's renewal, fenced by the token it still holds, extends
	// the lease a little past the fetch; then it freezes again.
	var renewedUntil time.Time
	err = pool.QueryRow(ctx, `UPDATE stepwise_checkpoint SET lease_until = clock_timestamp() + interval '200 milliseconds'
		WHERE key = 'thawed' AND fencing_token = $1 AND owner = $2 RETURNING lease_until`, old.Token, oldOwner).Scan(&renewedUntil)
	require.NoError(t, err, "the thawed holder's renewal did not land: the takeover moved the token")

	run = waitRun(t, pool, "thawed", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))
	// The state the old rule took over: the renewed lease lapsed, and the claim came more than
	// a Lease after the takeover job's fetch.
	var claimedAt, fetchedAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT min(at) FROM stepwise_event WHERE subject = 'thawed' AND kind = 'lease.claim' AND actor <> $1),
		(SELECT attempted_at FROM river_job WHERE kind = $2 AND id <> $3 ORDER BY id LIMIT 1)`,
		oldOwner, (countArgs{}).Kind(), oldJob).Scan(&claimedAt, &fetchedAt))
	t.Logf("takeover job: fetch to claim %s (Lease %s); renewed lease lapsed %s before the claim",
		claimedAt.Sub(fetchedAt).Round(time.Millisecond), lease, claimedAt.Sub(renewedUntil).Round(time.Millisecond))
	require.Greater(t, claimedAt.Sub(fetchedAt), lease, "the takeover job's claim was not delayed past a lease after its fetch")
	require.True(t, renewedUntil.After(fetchedAt) && renewedUntil.Before(claimedAt), "the thawed holder's lease did not outlive the fetch and lapse before the claim")
	takeovers := queryInt(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'thawed' AND kind = 'run.takeover'`)
	require.Equal(t, 1, takeovers, "the live worker of the takeover's job was taken over because the old holder renewed")
	perN, _ := itemCounts(t, pool, "items", "thawed")
	requireExactlyOnce(t, perN, 30)
}

// The two takeover rules, told apart by the lease's owner: a lapsed lease its own fetch took
// (the owner the worker writes for the client that fetched the job, the job and its attempt)
// is taken over one Lease past the fetch; a lapsed lease under any other owner, two. Pins the
// expired scan to the worker's owner form: were they to drift apart, every crash would wait
// two Leases (and the unleased scan's paging) and nothing else would notice.
func TestExpiredScanCountsOnlyTheLeaseOfTheJobsOwnFetch(t *testing.T) {
	t.Parallel()
	// Times are set, not waited for: a long Lease leaves seconds of margin on a slow machine.
	const lease = 5 * time.Second
	pool := mustPool(t, testkit.DBURL(t))
	createItems(t, pool, "items", true)
	e := newEnv(t, pool, &workflow.Config{Lease: lease}, nil, map[string]river.QueueConfig{})
	ctx := context.Background()
	// stall leaves key's job fetched by stalledClient ago, and its lease, owned by
	// owner(job), lapsed.
	stall := func(key string, ago time.Duration, owner func(job int64) string) {
		t.Helper()
		_, err := workflow.Start(ctx, e.client, key, countArgs{Total: 10, Batch: 10, Table: "items"}, nil)
		require.NoError(t, err)
		run, err := workflow.GetRun(ctx, pool, key)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_by = ARRAY[$2::text],
			attempted_at = now() - $3 * interval '1 millisecond' WHERE id = $1`, *run.RiverJobID, stalledClient, ago.Milliseconds())
		require.NoError(t, err)
		_, err = e.engine.Checkpoints().Claim(ctx, key, owner(*run.RiverJobID), 1)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE stepwise_run SET status = 'running', attempts = attempts + 1 WHERE key = $1`, key)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE stepwise_checkpoint SET lease_until = now() - interval '100 milliseconds' WHERE key = $1`, key)
		require.NoError(t, err)
	}
	stall("own", 6*time.Second, func(job int64) string { return workflow.OwnerForTest(stalledClient, job, 1) })
	stall("other-client", 6*time.Second, func(job int64) string { return workflow.OwnerForTest("other-client", job, 1) })
	stall("other-attempt", 6*time.Second, func(job int64) string { return workflow.OwnerForTest(stalledClient, job, 2) })

	res, err := e.engine.Maintain(ctx, e.client)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"own"}, res.TakenOver,
		"1.2 Leases past the fetch only the lease of the job's own fetch is taken over")

	// Past two Leases the others are the unleased scan's.
	_, err = pool.Exec(ctx, `UPDATE river_job j SET attempted_at = now() - interval '11 seconds'
		FROM stepwise_run r WHERE r.river_job_id = j.id AND r.key IN ('other-client', 'other-attempt')`)
	require.NoError(t, err)
	res, err = e.engine.Maintain(ctx, e.client)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"other-client", "other-attempt"}, res.TakenOver)
}
