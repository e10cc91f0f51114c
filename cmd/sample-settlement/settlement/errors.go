package settlement

import (
	"errors"
	"fmt"
)

// ErrInvalidDate is matched by errors from ParseDate: the message quotes the input and the
// format wanted.
var ErrInvalidDate = errors.New("invalid settlement date")

// ErrAlreadySeeded is returned by Seed when the date already has transactions: seeding twice
// would double the day's volume and every total built on it.
var ErrAlreadySeeded = errors.New("date already seeded")

// ErrNoSuchSettlement is returned when a settlement or payout named by the caller does not
// exist.
var ErrNoSuchSettlement = errors.New("no such settlement")

// ErrInvariant is matched by the error Check returns when an invariant does not hold; the
// Result lists which ones and their evidence.
var ErrInvariant = errors.New("invariant violated")

// ErrStaleState is returned by Resolve when the operation is no longer in the state the
// person saw: somebody (the reconciler, another person) moved it first. Look again.
var ErrStaleState = errors.New("operation is no longer in the state you saw")

// ErrNotResolvable is returned by Resolve for a payout that is not waiting for a person:
// PENDING, PROCESSING, RETRYABLE ones are still being delivered, SUCCEEDED and
// FAILED_PERMANENT ones are final.
var ErrNotResolvable = errors.New("payout is not waiting for a manual decision")

// DateError is the error of ErrInvalidDate.
type DateError struct {
	Input string
	Err   error
}

func (e *DateError) Error() string {
	return fmt.Sprintf("date %q: want YYYY-MM-DD, e.g. 2026-03-01", e.Input)
}

func (e *DateError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrInvalidDate) true.
func (e *DateError) Is(target error) bool { return target == ErrInvalidDate }
