package schedule

import (
	"errors"

	"github.com/stepwise-go/stepwise/internal/errkind"
)

// ErrInvalid is matched (errors.Is) by every error Add returns for a schedule it cannot
// accept; the message names the schedule, the field and the fix.
var ErrInvalid = errors.New("schedule: invalid schedule")

// ErrNotFound is returned for a schedule name that has no row (it was never ticked).
var ErrNotFound = errkind.NotFound("schedule: schedule not found")

// ErrSlotNotFound is returned by stepwise.Client.SlotGet for a slot no tick has decided: not due yet, not
// a slot of the schedule's spec, or due but not yet ticked.
var ErrSlotNotFound = errkind.NotFound("schedule: slot not found")

// ErrSlotRunsMissing is returned by StartSlot for a slot that was materialized and whose runs
// are no longer there (deleted by hand, or by a retention.Prune older than the one that keeps
// runs): starting them again would redo the slot's work, settling the date a second time.
var ErrSlotRunsMissing = errors.New("schedule: slot's runs are missing")
