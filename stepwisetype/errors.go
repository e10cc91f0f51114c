package stepwisetype

import "errors"

// ErrNotFound matches every "not found" of Stepwise: a run key, an operation id, a schedule or
// a slot that does not exist. The error's message names what was not found; there is no
// other sentinel to match.
var ErrNotFound = errors.New("stepwise: not found")

// ErrChanged matches every refusal of a person's decision taken on an older view: the run or
// operation moved since the version the person saw (ExpectedVersion). Nothing was done; read
// it again and decide again. errors.As to a *workflow.RunChangedError or an
// *outbox.StateChangedError says what it is now.
var ErrChanged = errors.New("stepwise: changed since it was read")
