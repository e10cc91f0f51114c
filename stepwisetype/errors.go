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

// NotFound returns a package's own "not found" sentinel, with its own message, that also
// matches ErrNotFound: errors.Is(err, workflow.ErrRunNotFound) names what was missing, and
// errors.Is(err, stepwisetype.ErrNotFound) catches every kind at once.
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
