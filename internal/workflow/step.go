package workflow

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// Step is what a step function receives: the step's transaction, the run's input and the
// cursor as last committed. The step writes through Tx, moves Cursor forward and returns a
// Next; Stepwise then commits Tx together with the new cursor, fenced by the run's token.
type Step[A river.JobArgs, C any] struct {
	// Tx is the step's transaction. Every business write and outbox.Enqueue of the step goes
	// through it, so they commit together with the cursor or not at all. Do not commit or
	// roll it back: Commit and Rollback on it return an error and fail the step.
	Tx pgx.Tx

	// Args is the run's input (the River job's args).
	Args A

	// Cursor is the cursor as last committed (the zero value on the first step). Set it to
	// where the next step must start.
	Cursor C

	// RunKey is the run's key. There is no need to pass it on: outbox.Enqueue, called with
	// the step's ctx and Tx, records it on every operation the step enqueues by itself (and
	// refuses an operation carrying another run's key), so the run's batch status can be
	// proven from its operations. Use it to name the run in logs and business keys.
	RunKey string

	// Number is the 1-based number of this step within the run, across attempts.
	Number int64

	// Token is the fencing token this attempt holds.
	Token int64

	// Job is the River job delivering this attempt.
	Job *river.Job[A]

	items    int
	itemsSet bool

	raw   pgx.Tx // the protocol's transaction under Tx, for StartChild
	woken *Woken // what the wait before this step ended with (wait.go)
}

// ReportItems records how many items (merchants settled, rows moved...) this step handled,
// as the stepwise.step.items attribute of the step's trace span. Optional; the last call
// counts. It changes nothing else: the step's outcome is its Next.
func (s *Step[A, C]) ReportItems(n int) {
	s.items, s.itemsSet = n, true
}

// Stepper is a step function: a River worker whose Work is a loop of fenced, checkpointed
// steps. Embed StepperDefaults to satisfy the optional methods. A stepper whose cursor's
// shape changed between releases also implements CursorVersioner and CursorUpgrader.
type Stepper[A river.JobArgs, C any] interface {
	// Step does one bounded piece of work in s.Tx and says what comes next. Returning an
	// error rolls back everything the step wrote; the run is retried from the last
	// committed cursor with River's backoff.
	Step(ctx context.Context, s *Step[A, C]) (Next, error)

	// StepOptions returns per-worker options, or nil for the Engine's defaults.
	StepOptions() *StepOpts
}

// StepOpts are per-worker overrides of the Engine's configuration.
type StepOpts struct {
	// Slice overrides Config.Slice for this worker.
	Slice time.Duration
}

// StepperDefaults is embedded in a Stepper to provide defaults for its optional methods, as
// river.WorkerDefaults does for River workers: the Engine's StepOptions, cursor version 1
// and no cursor upgrade (cursorversion.go).
type StepperDefaults[A river.JobArgs, C any] struct{}

// StepOptions returns nil: the Engine's configuration applies.
func (StepperDefaults[A, C]) StepOptions() *StepOpts { return nil }

// StepFunc adapts a function into a Stepper, like river.WorkFunc.
func StepFunc[A river.JobArgs, C any](f func(ctx context.Context, s *Step[A, C]) (Next, error)) Stepper[A, C] {
	return &stepFunc[A, C]{f: f}
}

type stepFunc[A river.JobArgs, C any] struct {
	StepperDefaults[A, C]
	f func(ctx context.Context, s *Step[A, C]) (Next, error)
}

func (sf *stepFunc[A, C]) Step(ctx context.Context, s *Step[A, C]) (Next, error) { return sf.f(ctx, s) }

type nextKind int

const (
	// nextUnset is the zero Next{}: refused, so a step that forgets to say what comes next
	// fails loudly instead of looping forever.
	nextUnset nextKind = iota
	nextContinue
	nextDone
	nextSleep
	nextFail
	nextWait
)

// Next is a step's outcome: what Stepwise does after committing it.
type Next struct {
	kind  nextKind
	sleep time.Duration
	until time.Time
	err   error
	wait  *waitSpec // for nextWait (wait.go)
}

// Continue commits the step and runs the next one now (within the attempt's time slice).
func Continue() Next { return Next{kind: nextContinue} }

// Done commits the step, marks the run succeeded and completes the River job, in one commit.
func Done() Next { return Next{kind: nextDone} }

// Sleep commits the step, releases the lease and resumes the run after d.
func Sleep(d time.Duration) Next { return Next{kind: nextSleep, sleep: d} }

// Until commits the step, releases the lease and resumes the run at t.
func Until(t time.Time) Next { return Next{kind: nextSleep, until: t} }

// Fail commits the step and ends the run as failed with err: terminal, recorded on the run,
// not retried. Use it for errors no retry can fix (invalid input); return an error from Step
// instead for errors a retry may fix.
func Fail(err error) Next { return Next{kind: nextFail, err: err} }

func (n Next) sleepFor(now time.Time) time.Duration {
	if !n.until.IsZero() {
		if d := n.until.Sub(now); d > 0 {
			return d
		}
		return 0
	}
	if n.sleep < 0 {
		return 0
	}
	return n.sleep
}
