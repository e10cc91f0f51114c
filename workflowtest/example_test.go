package workflowtest_test

import (
	"context"
	"fmt"
	"log"
	"os/exec"
	"syscall"
	"time"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// RunChaos against real processes. Here the workers are plain `sleep` processes; in a real
// test they are your workers (workflowtest.Start(t, "worker", ...)), and Until asks your
// database whether all work is done.
func ExampleRunChaos() {
	checks := 0
	var started []workflowtest.Worker
	defer func() { // workers are the caller's: stop the ones still running
		for _, w := range started {
			w.Kill()
		}
	}()
	report, err := workflowtest.RunChaos(context.Background(), &workflowtest.ChaosConfig{
		Start: func() (workflowtest.Worker, error) {
			w, err := startSleeper()
			if err == nil {
				started = append(started, w)
			}
			return w, err
		},
		Workers:   2,
		Seed:      42,
		KillMin:   10 * time.Millisecond,
		KillMax:   20 * time.Millisecond,
		StopEvery: -1, // kills only
		Until: func(ctx context.Context) (bool, error) {
			checks++
			return checks > 3, nil // "all work done" after three hits
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("kills=%d starts=%d quiet=%v\n", report.Kills, report.Starts, report.Quiet)
	// Output: kills=3 starts=5 quiet=true
}

// CheckInvariants over Stepwise's tables. The audit trail below has a fencing token going
// backwards, as a zombie's claim would leave it.
func ExampleCheckInvariants() {
	ctx := context.Background()
	pool, cleanup := testkit.ExampleDB(ctx)
	defer cleanup()
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, token) VALUES
		('settle/2026-11-29/0', 'lease.claim', 'worker-a', 1),
		('settle/2026-11-29/0', 'lease.claim', 'worker-b', 2),
		('settle/2026-11-29/0', 'lease.claim', 'worker-a', 1)`)
	if err != nil {
		log.Fatal(err)
	}
	violations, err := workflowtest.CheckInvariants(ctx, pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(workflowtest.FormatViolations(violations))
	// Output: invariant 2 (fencing tokens per key strictly increase) violated: key settle/2026-11-29/0: claim token 1 (event 3) after token 2
}

type sleeper struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startSleeper() (workflowtest.Worker, error) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &sleeper{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	return s, nil
}

func (s *sleeper) Pid() int    { return s.cmd.Process.Pid }
func (s *sleeper) Kill()       { _ = s.cmd.Process.Kill(); <-s.done }
func (s *sleeper) Stop() error { return s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *sleeper) Cont() error { return s.cmd.Process.Signal(syscall.SIGCONT) }
func (s *sleeper) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}
