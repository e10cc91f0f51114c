package workflow

import (
	"errors"

	"github.com/stepwise-go/stepwise/checkpoint"
)

// ErrFenced is returned when a step's commit was refused because another worker claimed the
// run after this worker's lease lapsed. Nothing the step wrote was committed.
var ErrFenced = checkpoint.ErrFenced

// ErrRunConflict is returned by Start when a run with the key already exists with a
// different workflow or a different input: a key names one run, forever.
var ErrRunConflict = errors.New("workflow: run key already used for a different run")

// ErrRunNotFound is returned for a run key that does not exist.
var ErrRunNotFound = errors.New("workflow: run not found")

// errLeaseLost is the cause set on a step's context when its heartbeat could not keep the
// lease; the step's transaction is abandoned and River retries the job.
var errLeaseLost = errors.New("workflow: lease lost while the step ran")

// ErrRunCancelled is the cause of a step context cancelled by CancelRun.
var ErrRunCancelled = errors.New("workflow: run cancelled")
