// Package workflowtest helps users test their Stepwise workflows, including under real
// crashes.
//
// # Real processes
//
// Crash safety cannot be tested with goroutines: a goroutine cannot be kill -9'ed halfway
// through a commit, and a paused goroutine does not stop its heartbeat. Start runs the test
// binary itself as a child process playing a named role, so a test can SIGKILL, SIGSTOP and
// SIGCONT a real worker:
//
//	func init() {
//		workflowtest.RegisterRole("worker", func(ctx context.Context, env map[string]string) error {
//			pool, err := pgxpool.New(ctx, env["DATABASE_URL"])
//			if err != nil {
//				return err
//			}
//			defer pool.Close()
//			fmt.Println("ready")
//			return runWorkers(ctx, pool) // until SIGTERM
//		})
//	}
//
//	func TestMain(m *testing.M) {
//		if handled, code := workflowtest.RunRoleIfChild(); handled {
//			os.Exit(code)
//		}
//		os.Exit(m.Run())
//	}
//
//	func TestWorkerSurvivesKill(t *testing.T) {
//		w := workflowtest.Start(t, "worker", "DATABASE_URL="+url)
//		if _, err := w.WaitForLine(ctx, "ready"); err != nil {
//			t.Fatal(err)
//		}
//		w.Kill() // SIGKILL, like a power cut
//		...
//	}
//
// Children are killed at the test's cleanup and exit on their own if the test process dies,
// so none outlives the test. The harness uses process groups and POSIX signals: it runs on
// Linux and macOS, not Windows.
//
// # Chaos
//
// RunChaos runs N worker processes and hits a random one every KillMin..KillMax: SIGKILL and
// restart, or (every StopEvery-th hit) SIGSTOP for StopFor, longer than the lease, then
// SIGCONT, so a worker frozen holding a lease wakes into a run someone else now owns. Then it waits for quiet:
//
//	report, err := workflowtest.RunChaos(ctx, &workflowtest.ChaosConfig{
//		Start: func() (workflowtest.Worker, error) {
//			return workflowtest.Start(t, "worker", "DATABASE_URL="+url), nil
//		},
//		Workers:  3,
//		Duration: 30 * time.Second,
//		Until:    allRunsFinished, // func(ctx) (bool, error)
//	})
//	t.Log(report) // seed=… kills=… stops=…: the seed repeats the run
//
// # Invariants
//
// CheckInvariants checks invariants 1, 2, 4 and 5 of docs/design.md over Stepwise's tables (one run per
// slot and shard, one operation per business key, strictly increasing fencing tokens, every
// operation proven or MANUAL, every due slot finished or recorded as skipped) and returns
// each violation with its evidence; add your own with CheckOpts.Domain:
//
//	violations, err := workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{
//		Quiet:  true,
//		Domain: []workflowtest.CheckFunc{everyItemOnce},
//	})
//
// # The external system's request log
//
// An external system that deduplicates by idempotency key hides a second send; yours may not
// (refusals and rate-limit rejections are often not remembered per key, and two concurrent
// requests with one key can both pass). Give CheckInvariants what actually reached it, from
// your fake's or sandbox's log, and the send discipline is checked against it:
//
//	violations, err := workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{
//		Requests: log,        // []workflowtest.Request: operation id, amount, arrived, decided, ended, effect
//		Grace:    grace,      // the reconciler's grace period
//	})
//
// It reports, each with the ids and times as evidence: two requests for one operation in
// flight at once; a request after the ledger recorded the operation SUCCEEDED,
// FAILED_PERMANENT or MANUAL (unless a person resolved it back); a not-found believed (and
// resent) before the previous request ended plus the grace; an effect that matches no
// operation, has another amount, or is an operation's second.
//
// # Takeovers
//
// RunChaos records the life of every worker it starts (ChaosReport.Workers: start, kill,
// SIGSTOP..SIGCONT). With CheckOpts.Liveness (ChaosReport.Liveness), every takeover of a run
// whose holder was alive, running and connected is a violation, and so is a run failed after
// fewer crashes and errors than MaxAttempts; CountTakeovers counts them. Workers must use
// a River client ID the harness can name (ChaosConfig.WorkerID), as lease owners begin with it.
//
// internal/workflow/chaos_test.go uses both on Stepwise itself, and shows the suite failing on a build
// whose fence is switched off; cmd/stepwise-lab/chaos runs them on the sample service.
package workflowtest
