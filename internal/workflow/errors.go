package workflow

import (
	"errors"
	"fmt"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/errkind"
	"github.com/stepwise-go/stepwise/internal/runstart"
)

// ErrFenced is returned when a step's commit was refused because another worker claimed the
// run after this worker's lease lapsed. Nothing the step wrote was committed.
var ErrFenced = checkpoint.ErrFenced

// ErrRunConflict is returned by Start when a run with the key already exists with a
// different workflow or a different input: a key names one run, forever.
var ErrRunConflict = runstart.ErrConflict

// ErrRunNotFound is returned for a run key that does not exist.
var ErrRunNotFound = errkind.NotFound("workflow: run not found")

// errLeaseLost is the cause set on a step's context when its heartbeat could not keep the
// lease; the step's transaction is abandoned and River retries the job.
var errLeaseLost = errors.New("workflow: lease lost while the step ran")

// ErrRunCancelled is the cause of a step context cancelled by CancelRun.
var ErrRunCancelled = errors.New("workflow: run cancelled")

// ErrRunNotResumable is returned by ResumeTx (and stepwise.Client.RunResume) for a run that is
// not failed or cancelled.
var ErrRunNotResumable = errors.New("workflow: run is not resumable")

// ErrRunChanged is returned (as a *RunChangedError) by ResumeTx (and stepwise.Client.RunResume)
// when the run moved since the person read it, or while being resumed.
var ErrRunChanged = errkind.Changed("workflow: run changed since it was read")

// RunChangedError says what a run is now, for the person who decided on an older view of it.
type RunChangedError struct {
	Key string
	// SeenVersion is the version the decision was taken on; Version, Status and LastError
	// are the run's now.
	SeenVersion, Version int64
	Status               RunStatus
	LastError            *string
}

func (e *RunChangedError) Error() string {
	last := ""
	if e.LastError != nil && *e.LastError != "" {
		last = fmt.Sprintf(", last error %q", *e.LastError)
	}
	if e.SeenVersion > e.Version {
		// A version the run never had (a typo, or a page of another database).
		return fmt.Sprintf("%s: run %q has never had version %d: it is %s now (version %d%s); nothing was done: read it again and decide again",
			ErrRunChanged.Error(), e.Key, e.SeenVersion, e.Status, e.Version, last)
	}
	return fmt.Sprintf("%s: run %q changed status %d time(s) since version %d: it is %s now (version %d%s); nothing was done: read it again and decide again",
		ErrRunChanged.Error(), e.Key, e.Version-e.SeenVersion, e.SeenVersion, e.Status, e.Version, last)
}

// Is makes errors.Is(err, ErrRunChanged) and errors.Is(err, stepwisetype.ErrChanged) true.
func (e *RunChangedError) Is(target error) bool { return errors.Is(ErrRunChanged, target) }
