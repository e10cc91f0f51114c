package workflow_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/workflowtest"
)

// Takeover with maintenance run by River's leader among the workers themselves (no helper
// process): kill -9 whichever worker holds the run, several times, and measure how long the
// run waits. When the killed worker was also River's leader, a new leader must be elected
// first (River's leader TTL), which the test reports separately.
func TestTakeoverByLeaderRunMaintenance(t *testing.T) {
	t.Parallel()
	for _, everywhere := range []bool{false, true} {
		t.Run(fmt.Sprintf("RunMaintenance in every process=%v", everywhere), func(t *testing.T) {
			t.Parallel()
			testTakeoverByLeader(t, everywhere)
		})
	}
}

func testTakeoverByLeader(t *testing.T, everywhere bool) {
	if testing.Short() && !everywhere {
		// Three kills of River's leader, each waiting out its re-election: about a minute
		// under the race detector, for goroutines the other variant and the in-process tests
		// already run. go test without -short runs it.
		t.Skip("waits out three leader re-elections")
	}
	const lease = 2 * time.Second
	url, e := processEnv(t, lease, 0)
	startRun(t, e, "led", countArgs{Total: 20000, Batch: 20, Table: "items"})
	env := workerEnv(url, lease, lease, "STEP_SLEEP=20ms", "WITH_MAINTENANCE=1", "MAINTENANCE_MS=1000")
	if everywhere {
		env = append(env, "MAINTAIN_EVERYWHERE=1")
	}
	procs := []*workflowtest.Process{workflowtest.Start(t, "wf-worker", env...), workflowtest.Start(t, "wf-worker", env...)}

	var plain, leaderKilled []time.Duration
	for kill := 0; kill < 3; kill++ {
		line, err := firstStepLine(t, procs)
		require.NoError(t, err)
		pid, _ := strconv.Atoi(stepLine.FindStringSubmatch(line)[4])
		victim, other := 0, 1
		if procs[1].Pid() == pid {
			victim, other = 1, 0
		}
		wasLeader := leaderOf(t, e, procs[victim])
		time.Sleep(300 * time.Millisecond)
		procs[victim].Kill()
		killedAt := time.Now()
		_, err = procs[other].WaitForLine(waitCtx(t, 60*time.Second), "step run=led")
		require.NoError(t, err)
		took := time.Since(killedAt)
		if wasLeader {
			leaderKilled = append(leaderKilled, took)
		} else {
			plain = append(plain, took)
		}
		procs[victim] = workflowtest.Start(t, "wf-worker", env...)
		procs[victim], procs[other] = procs[other], procs[victim]
	}
	sort.Slice(plain, func(i, j int) bool { return plain[i] < plain[j] })
	t.Logf("takeover after kill -9, lease %s, maintenance every 1s (in every process: %v): non-leader killed %v; leader killed %v", lease, everywhere, plain, leaderKilled)
	for _, d := range plain {
		require.Less(t, d, lease+6*time.Second, "far slower than lease + maintenance interval (slack for a loaded CI machine)")
	}
	if everywhere {
		for _, d := range leaderKilled {
			require.Less(t, d, lease+6*time.Second, "with RunMaintenance everywhere, a dead leader must not cost River's leader failover (~17s here)")
		}
	}
}

// leaderOf reports whether p's River client is the elected leader, from the lease owner id
// ("<river client id>/job-N/attempt-M") of the run p is working.
func leaderOf(t *testing.T, e *env, p *workflowtest.Process) bool {
	t.Helper()
	var leaderID, owner string
	if err := e.pool.QueryRow(context.Background(), `SELECT leader_id FROM river_leader`).Scan(&leaderID); err != nil {
		return false
	}
	_ = e.pool.QueryRow(context.Background(), `SELECT coalesce(owner, '') FROM stepwise_checkpoint WHERE key = 'led'`).Scan(&owner)
	return strings.HasPrefix(owner, leaderID+"/")
}
