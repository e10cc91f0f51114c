package bench

import "errors"

// ErrUsage is matched by the errors Main returns for a bad command line (an unknown flag, a
// malformed list, an unknown section); the message names the flag and what it wants.
var ErrUsage = errors.New("bench: usage")

// ErrTargetMissed is matched by the error Main returns when --check is set and one of the
// bench's targets (the report's targets section) was missed in this run; the report says which.
var ErrTargetMissed = errors.New("bench: target missed")

// usageError marks err as a command-line mistake.
type usageError struct{ err error }

func (e *usageError) Error() string        { return e.err.Error() }
func (e *usageError) Unwrap() error        { return e.err }
func (e *usageError) Is(target error) bool { return target == ErrUsage }
