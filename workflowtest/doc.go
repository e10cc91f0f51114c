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
package workflowtest
