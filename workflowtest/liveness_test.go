package workflowtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// TestLivenessChecksFailOnNeedlessTakeovers: takeovers of runs held by a worker that was
// alive, running and connected are violations; takeovers after a kill, a pause or a cut-off are
// not; a run failed after fewer crashes than MaxAttempts is a violation, one failed after
// MaxAttempts crashes or by its own step's Fail is not.
func TestLivenessChecksFailOnNeedlessTakeovers(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	run := func(key, status string) {
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) VALUES ($1)`, key)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, status, last_error) VALUES ($1, 'w', '{}', $2, 'boom')`, key, status)
		require.NoError(t, err)
	}
	event := func(key, kind, actor string, s float64, detail string) {
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, detail, at) VALUES ($1, $2, $3, $4::jsonb, $5)`,
			key, kind, actor, detail, at(s))
		require.NoError(t, err)
	}
	claim := func(key, owner string, s float64) { event(key, "lease.claim", owner, s, `{}`) }
	takeover := func(key string, s float64) { event(key, "run.takeover", "maintenance", s, `{}`) }

	live := &workflowtest.Liveness{
		Window:      5 * time.Second,
		MaxAttempts: 3,
		Workers: []workflowtest.WorkerLife{
			{ID: "healthy", Pid: 101, Started: at(0)},
			{ID: "killed", Pid: 102, Started: at(0), Died: at(20)},
			{ID: "paused", Pid: 103, Started: at(0), Paused: []workflowtest.Interval{{From: at(30), To: at(34)}}},
			{ID: "cut", Pid: 104, Started: at(0), CutOff: []workflowtest.Interval{{From: at(40), To: at(41)}}},
			{ID: "stalled", Pid: 105, Started: at(0), Paused: []workflowtest.Interval{{From: at(60), To: at(61)}}},
			{ID: "resumed", Pid: 106, Started: at(0), Paused: []workflowtest.Interval{{From: at(80), To: at(84)}}},
		},
		UnleasedPause: 2 * time.Second,
	}
	// needless: held by "healthy" at each takeover, and failed after them.
	run("needless", "failed")
	for i := range 3 {
		claim("needless", "healthy/job-1/attempt-1", float64(10*i))
		takeover("needless", float64(10*i+5))
	}
	event("needless", "run.finish", "maintenance", 40, `{"error": "vanished"}`)
	// justified: held by the killed, paused and cut-off workers; failed after 3 crashes.
	run("justified", "failed")
	claim("justified", "killed/job-2/attempt-1", 15)
	takeover("justified", 22)
	claim("justified", "paused/job-3/attempt-1", 29)
	takeover("justified", 35)
	claim("justified", "cut/job-4/attempt-1", 39)
	takeover("justified", 42)
	event("justified", "run.finish", "maintenance", 50, `{"error": "vanished"}`)
	// fetched: last claimed by "healthy", but its job was then fetched by "killed", which died
	// before claiming: the takeover answers that death.
	run("fetched", "running")
	claim("fetched", "healthy/job-6/attempt-1", 10)
	var job int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO river_job (kind, args, max_attempts, queue, state, attempted_by, priority)
		VALUES ('w', '{}', 25, 'default', 'running', ARRAY['healthy', 'killed'], 1) RETURNING id`).Scan(&job))
	event("fetched", "run.takeover", "maintenance", 23, fmt.Sprintf(`{"old_job": %d}`, job))
	// refetched: last claimed by "healthy"; its job was then fetched by "paused", frozen before
	// it claimed, and taken over; after the takeover "healthy" fetched the old job again (to
	// find it superseded). The takeover answers the pause that its event recorded
	// (fetched_by), not the job's last fetcher as read now.
	run("refetched", "running")
	claim("refetched", "healthy/job-7/attempt-1", 25)
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO river_job (kind, args, max_attempts, queue, state, attempted_by, priority)
		VALUES ('w', '{}', 25, 'default', 'running', ARRAY['healthy', 'paused', 'healthy'], 1) RETURNING id`).Scan(&job))
	event("refetched", "run.takeover", "maintenance", 33, fmt.Sprintf(`{"old_job": %d, "fetched_by": "paused"}`, job))
	// after-kill: held by "killed", which died (justified), and then the takeover's own job,
	// fetched by "healthy" after that claim and never claimed, taken over again: that answers
	// "healthy", alive, not the holder's death long before.
	run("after-kill", "running")
	claim("after-kill", "killed/job-8/attempt-1", 15)
	takeover("after-kill", 22)
	event("after-kill", "run.takeover", "maintenance", 27, fmt.Sprintf(`{"old_job": 9, "fetched_by": "healthy", "fetched_at": %q}`, at(24).Format(time.RFC3339Nano)))
	// A one-second stall of "stalled": enough to lapse a lease (justified), not enough to leave
	// a released run unrecorded for two leases (needless, at UnleasedPause 2s).
	run("stall-lapsed", "running")
	claim("stall-lapsed", "stalled/job-10/attempt-1", 55)
	takeover("stall-lapsed", 62)
	run("stall-released", "running")
	claim("stall-released", "stalled/job-11/attempt-1", 55)
	event("stall-released", "run.release", "stalled/job-11/attempt-1", 59.5, `{"reason": "slice"}`)
	takeover("stall-released", 62)
	// own-fetch: "resumed" held the run and was paused (the first takeover, justified); thawed,
	// it fetched the takeover's job itself and never claimed it: its pause ended before that
	// fetch and explains nothing of the second.
	run("own-fetch", "running")
	claim("own-fetch", "resumed/job-13/attempt-1", 79)
	takeover("own-fetch", 83)
	event("own-fetch", "run.takeover", "maintenance", 90, fmt.Sprintf(`{"old_job": 14, "fetched_by": "resumed", "fetched_at": %q}`, at(85).Format(time.RFC3339Nano)))
	// pre-fetch-pause: held by "healthy"; its snoozed job then fetched by "paused" right after
	// its pause ended, and never claimed: a pause before the fetch explains nothing.
	run("pre-fetch-pause", "running")
	claim("pre-fetch-pause", "healthy/job-15/attempt-1", 20)
	event("pre-fetch-pause", "run.takeover", "maintenance", 38, fmt.Sprintf(`{"old_job": 15, "fetched_by": "paused", "fetched_at": %q}`, at(34.1).Format(time.RFC3339Nano)))
	// deliberate: the step failed the run.
	run("deliberate", "failed")
	claim("deliberate", "healthy/job-5/attempt-1", 1)
	event("deliberate", "run.finish", "healthy/job-5/attempt-1", 2, `{"steps": 3}`)

	count, vs, err := workflowtest.CountTakeovers(ctx, pool, live)
	require.NoError(t, err)
	t.Log(workflowtest.FormatViolations(vs))
	require.Equal(t, workflowtest.TakeoverCount{Takeovers: 15, Needless: 7}, count)
	require.Len(t, vs, 8)
	for _, v := range vs[:3] {
		require.Equal(t, "no takeover of a run whose worker was alive, running and connected", v.Name)
		require.Contains(t, v.Evidence, "run needless taken over")
		require.Contains(t, v.Evidence, "healthy/job-1/attempt-1 (pid 101")
		// What the holder last did: claimed 5s before, never released, so its lease lapsed.
		require.Contains(t, v.Evidence, "the holder claimed at")
		require.Contains(t, v.Evidence, "(5s before) and had not released the run: its lease lapsed")
	}
	require.Contains(t, vs[3].Evidence, "run after-kill taken over")
	require.Contains(t, vs[3].Evidence, "for the job healthy fetched (pid 101")
	require.Contains(t, vs[4].Evidence, "run stall-released taken over")
	require.Contains(t, vs[4].Evidence, "(for 2s or more)")
	require.Contains(t, vs[5].Evidence, "run own-fetch taken over")
	require.Contains(t, vs[6].Evidence, "run pre-fetch-pause taken over")
	require.Equal(t, "a run is failed only after MaxAttempts crashes or errors", vs[7].Name)
	require.Contains(t, vs[7].Evidence, "run needless failed")
	require.Contains(t, vs[7].Evidence, "1 crash(es) and 0 step error(s), fewer than MaxAttempts 3 (needless takeovers: 3)")

	// The same through CheckInvariants.
	all, err := workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{Liveness: live})
	require.NoError(t, err)
	require.Equal(t, vs, all)
}
