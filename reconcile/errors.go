package reconcile

import (
	"errors"

	"github.com/stepwise-go/stepwise/outbox"
)

// ErrStateChanged is returned by Resolve when the operation is no longer in the state the
// person saw: somebody (the reconciler, a colleague) moved it meanwhile. Look again before
// deciding. It is outbox.ErrStateChanged; errors.Is matches either.
var ErrStateChanged = outbox.ErrStateChanged

// ErrInvalidResolution is returned by Resolve for an outcome or an expected state a person may
// not choose: the outcome must be SUCCEEDED, FAILED_PERMANENT or RETRYABLE, and the expected
// state MANUAL or UNKNOWN_EXTERNAL.
var ErrInvalidResolution = errors.New("invalid manual resolution")

// ErrUnknownKind is returned for a kind with no KindConfig. It is outbox.ErrUnknownKind.
var ErrUnknownKind = outbox.ErrUnknownKind
