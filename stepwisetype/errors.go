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

// NotFound returns a "not found" sentinel with its own message that matches ErrNotFound: the
// internal packages make theirs with it, so each names what was missing.
func NotFound(msg string) error { return &kindError{msg: msg, kind: ErrNotFound} }

// Changed returns a package's own "changed since it was read" sentinel that also matches
// ErrChanged.
func Changed(msg string) error { return &kindError{msg: msg, kind: ErrChanged} }

// kindError is a sentinel of its own that is also one of the shared ones.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string        { return e.msg }
func (e *kindError) Is(target error) bool { return target == e.kind }
