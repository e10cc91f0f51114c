package reconcile

import "errors"

// ErrInvalidResolution is returned by Resolve for an outcome or an expected state a person may
// not choose: the outcome must be SUCCEEDED, FAILED_PERMANENT or RETRYABLE, and the expected
// state MANUAL or UNKNOWN_EXTERNAL.
var ErrInvalidResolution = errors.New("invalid manual resolution")
