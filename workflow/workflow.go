package workflow

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/internal/workflow"
)

// The engine that runs steps lives in an internal package, built, installed, maintained and
// drained by stepwise.Client; this package is what a step function touches: the Step it
// works in, the Next it returns, the Run it reads, and the errors a run's operations return.

// Stepper is a step function: River job args A (the run's input), a cursor C (what
// survives a crash) and a Step method called once per step, in the step's transaction.
// Register it with stepwise.AddWorker.
type Stepper[A river.JobArgs, C any] = workflow.Stepper[A, C]

// StepperDefaults gives a Stepper its optional methods (StepOptions, CursorVersion,
// UpgradeCursor) with their defaults; embed it and write Step.
type StepperDefaults[A river.JobArgs, C any] = workflow.StepperDefaults[A, C]

// StepFunc makes a Stepper of a function, for step functions without options.
func StepFunc[A river.JobArgs, C any](f func(ctx context.Context, s *Step[A, C]) (Next, error)) Stepper[A, C] {
	return workflow.StepFunc(f)
}

// Step is what a step function receives: the step's transaction (Tx: every business write
// and outbox.Enqueue of the step goes through it; do not commit or roll it back), the run's
// input (Args), the cursor as last committed (Cursor: set it to where the next step must
// start), the run's key (RunKey), the step's number (Number), the fencing token (Token) and
// the River job (Job). Stepwise commits Tx together with the new cursor, fenced by the run's
// token. Its methods: StartChild and StartRun start runs in Tx, Woken says what ended the
// wait before this step, ReportItems counts the step's items on its trace span.
type Step[A river.JobArgs, C any] = workflow.Step[A, C]

// StepOpts are a step function's own settings (StepOptions), overriding the client's.
type StepOpts = workflow.StepOpts

// CursorVersioner declares the version of the cursor a step function writes; see the
// package documentation, *When the cursor's shape changes*.
type CursorVersioner = workflow.CursorVersioner

// CursorUpgrader reads a cursor committed by an older version.
type CursorUpgrader[C any] = workflow.CursorUpgrader[C]

// ErrNoCursorUpgrade is what StepperDefaults.UpgradeCursor returns: the step function reads
// no older cursor version.
var ErrNoCursorUpgrade = workflow.ErrNoCursorUpgrade

// RunKeyer is implemented by job args that name their run themselves.
type RunKeyer = workflow.RunKeyer

// Next is what a step returns: continue, done, sleep, fail or wait.
type Next = workflow.Next

// Continue commits the step and runs the next one.
func Continue() Next { return workflow.Continue() }

// Done commits the step, marks the run succeeded and completes the River job, in one commit.
func Done() Next { return workflow.Done() }

// Fail commits the step and ends the run as failed with err: terminal, recorded on the run,
// not retried. Use it for errors no retry can fix (invalid input); return an error from Step
// instead for errors a retry may fix.
func Fail(err error) Next { return workflow.Fail(err) }

// Sleep commits the step, releases the lease and resumes the run after d.
func Sleep(d time.Duration) Next { return workflow.Sleep(d) }

// Until commits the step, releases the lease and resumes the run at t.
func Until(t time.Time) Next { return workflow.Until(t) }

// WaitForOperations commits the step and waits, holding no worker, until every operation this
// run enqueued (outbox operations whose RunKey is the run's) is at rest: SUCCEEDED or
// FAILED_PERMANENT. An operation in MANUAL is not at rest until a person resolves it. After
// timeout the run goes on anyway; Step.Woken says which.
func WaitForOperations(timeout time.Duration) Next { return workflow.WaitForOperations(timeout) }

// WaitForOperationsOrManual is WaitForOperations where an operation in MANUAL counts as at
// rest: the run goes on, and the step after the wait decides what a MANUAL operation means.
func WaitForOperationsOrManual(timeout time.Duration) Next {
	return workflow.WaitForOperationsOrManual(timeout)
}

// WaitForChildren commits the step and waits, holding no worker, until the child runs keys
// (started by this run with Step.StartChild) have finished: succeeded, failed or cancelled.
// No keys: every child of the run. A key that is not a child of the run fails the step.
func WaitForChildren(timeout time.Duration, keys ...string) Next {
	return workflow.WaitForChildren(timeout, keys...)
}

// WaitForSignal commits the step and waits, holding no worker, for a signal called name sent
// to this run (Signal). A signal sent before the run waits is kept and satisfies the wait at
// once; each signal is taken by one wait.
func WaitForSignal(name string, timeout time.Duration) Next {
	return workflow.WaitForSignal(name, timeout)
}

// Signal sends the signal name to the run runKey in tx: stored durably, then, in the same
// transaction, the run is made due if it waits for it (WaitForSignal). A signal sent before
// the run waits (or before it exists) is kept for its wait; sent again with the same id it
// is one signal (the first payload stays). payload is encoded as JSON (nil: JSON null).
func Signal(ctx context.Context, tx pgx.Tx, runKey, name, id string, payload any) error {
	return workflow.Signal(ctx, tx, runKey, name, id, payload)
}

// WaitKind is what a waiting run waits for.
type WaitKind = workflow.WaitKind

// The kinds of waits.
const (
	WaitOperations = workflow.WaitOperations
	WaitChildren   = workflow.WaitChildren
	WaitSignal     = workflow.WaitSignal
)

// WaitState is a waiting run's wait, as Run.Wait shows it.
type WaitState = workflow.WaitState

// Woken is what woke a step after a wait (Step.Woken).
type Woken = workflow.Woken

// ReceivedSignal is one signal that woke a step.
type ReceivedSignal = workflow.ReceivedSignal

// Run is one run as stepwise.Client's RunGet and RunList return it.
type Run = workflow.Run

// RunStatus is where a run is in its life.
type RunStatus = workflow.RunStatus

// The statuses of a run.
const (
	RunStatusPending   = workflow.RunStatusPending
	RunStatusRunning   = workflow.RunStatusRunning
	RunStatusSucceeded = workflow.RunStatusSucceeded
	RunStatusFailed    = workflow.RunStatusFailed
	RunStatusCancelled = workflow.RunStatusCancelled
)

// Retry is a run waiting to retry after a step error: failures in a row, budget, next try.
type Retry = workflow.Retry

// Awaiting says why a running run is not running a step now, when that is worth a look (a
// cursor version no live worker reads).
type Awaiting = workflow.Awaiting

// StartOpts are a run's options at stepwise.Client.RunStart and Step.StartRun (Step.StartChild
// takes only its InsertOpts).
type StartOpts = workflow.StartOpts

// Config is the step engine's part of stepwise.Config. Zero fields take their defaults
// (stepwise.Config.WithDefaults shows them): Lease LeaseDefault (30s), Heartbeat Lease/3,
// Slice 1m, StallTimeout Lease, LockTimeout 250ms, MaintenanceInterval 1s, MaintenanceQueue
// "default".
type Config = workflow.Config

// LeaseDefault is Config.Lease when it is zero: how long a worker keeps a run between
// renewals.
const LeaseDefault = workflow.LeaseDefault

// Errors of runs and steps. A run key that does not exist is an error matching
// stepwisetype.ErrNotFound (its message names the key); a decision on a run that moved since
// the person read it, one matching stepwisetype.ErrChanged (a *RunChangedError says how).
var (
	// ErrFenced: a step's commit was refused because another worker claimed the run after
	// this worker's lease lapsed. Nothing the step wrote was committed.
	ErrFenced = workflow.ErrFenced
	// ErrRunConflict: a run with the key already exists with another workflow or input.
	ErrRunConflict = workflow.ErrRunConflict
	// ErrRunCancelled is the cause of a step context cancelled by a cancel of its run.
	ErrRunCancelled = workflow.ErrRunCancelled
	// ErrRunNotResumable: the run is not failed or cancelled.
	ErrRunNotResumable = workflow.ErrRunNotResumable
)

// RunChangedError says what a run is now, for the person who decided on an older view of it.
type RunChangedError = workflow.RunChangedError
