// Package errkind makes the internal packages' own sentinels that also match one of
// stepwisetype's shared ones (ErrNotFound, ErrChanged), so that each names in its message
// what was missing or what moved, and a caller matches one sentinel whichever package said it.
package errkind

import "github.com/stepwise-go/stepwise/stepwisetype"

// NotFound returns a sentinel with its own message that matches stepwisetype.ErrNotFound.
func NotFound(msg string) error { return &kindError{msg: msg, kind: stepwisetype.ErrNotFound} }

// Changed returns a sentinel with its own message that matches stepwisetype.ErrChanged.
func Changed(msg string) error { return &kindError{msg: msg, kind: stepwisetype.ErrChanged} }

// kindError is a sentinel of its own that is also one of the shared ones.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string        { return e.msg }
func (e *kindError) Is(target error) bool { return target == e.kind }
