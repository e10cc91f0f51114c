package stepwisetype

import "errors"

// ErrNotFound matches every "not found" of the stepwise.Client's operator actions: a run key,
// an operation id, a schedule or a slot that does not exist. The Client wraps the packages'
// own sentinels (workflow.ErrRunNotFound, outbox.ErrNotFound, schedule.ErrNotFound,
// schedule.ErrSlotNotFound) so that errors.Is matches both this and the package's one.
var ErrNotFound = errors.New("stepwise: not found")

// ErrChanged matches every refusal of a person's decision taken on an older view: the run or
// operation moved since the version the person saw (ExpectedVersion). Nothing was done; read
// it again and decide again. The Client wraps the packages' own sentinels
// (workflow.ErrRunChanged, outbox.ErrStateChanged) so that errors.Is matches both.
var ErrChanged = errors.New("stepwise: changed since it was read")
