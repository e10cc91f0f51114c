// Package workflow is the step engine behind the public package of the same name and
// stepwise.Client: the River worker that runs a step function's steps (worker.go), the
// run's state machine (runstate.go), maintenance that takes over runs whose worker vanished
// (maintenance.go), waits (wait.go), drain (quiesce.go) and metrics. Programs import
// github.com/stepwise-go/stepwise/workflow, whose types are this package's; the Engine
// itself is reached only through stepwise.Client, which builds, installs, maintains and
// drains it.
//
// The step protocol (docs/design.md, *The step protocol*), per River attempt:
//
//  1. Claim the run's lease (checkpoint.Store.Claim); if held, snooze until it lapses.
//  2. Per step: begin with the stall timeout armed, run Step in the tx, then the fenced
//     write of cursor and lease (checkpoint.Store.Advance); on Done also the run's status and
//     river.JobCompleteTx, whose returned state is checked; commit.
//  3. A heartbeat renews the lease and cancels the step's context if it cannot.
//  4. After Config.Slice, release the lease in the last commit, recorded as a release on
//     purpose (runstate.go), and JobSnooze(0).
//  5. Maintenance (Engine.Maintain: a leader-run periodic job added by Engine.Install, and
//     Engine.RunMaintenance in every process) re-enqueues runs whose worker vanished.
//  6. Outcomes: Continue, Done, Sleep/Until, Fail and the waits; an error or panic rolls
//     back and River retries it after the back-off for the run's failures in a row.
//
// Every change of a run's state is one transition of runstate.go, conditional on the
// state its caller saw.
package workflow
