// Package workflow is the step engine behind the public package of the same name and
// stepwise.Client: the River worker that runs a step function's steps (worker.go), the
// run's state machine (runstate.go), maintenance that takes over runs whose worker vanished
// (maintenance.go), waits (wait.go), drain (quiesce.go) and metrics. Programs import
// github.com/stepwise-go/stepwise/workflow, whose types are this package's; the Engine
// itself is reached only through stepwise.Client, which builds, installs, maintains and
// drains it.
//
// The step protocol these files implement is the public package's documentation, *The step
// protocol*, and docs/design.md's; each step is commented here with the failure it guards
// against. Every change of a run's state is one transition of runstate.go, conditional on
// the state its caller saw.
package workflow
