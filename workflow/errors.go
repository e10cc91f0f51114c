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

// ErrInvalidSchedule is matched (errors.Is) by every error AddSchedule returns for a schedule
// it cannot accept; the message names the schedule, the field and the fix.
var ErrInvalidSchedule = errors.New("workflow: invalid schedule")

// ErrScheduleNotFound is returned for a schedule name that has no row (it was never ticked).
var ErrScheduleNotFound = errors.New("workflow: schedule not found")

// ErrSlotNotFound is returned by SlotStatus for a slot no tick has decided: not due yet, not
// a slot of the schedule's spec, or due but not yet ticked.
var ErrSlotNotFound = errors.New("workflow: schedule slot not found")
