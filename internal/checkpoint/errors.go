package checkpoint

import (
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-go/stepwise/internal/errkind"
)

// ErrFenced is returned when a write carries a fencing token that is no longer the key's
// current one: another owner claimed the key after this one's lease lapsed. The caller must
// roll back and stop; whatever it computed is the work of a zombie.
var ErrFenced = errors.New("checkpoint: fencing token superseded; another owner holds the key")

// ErrNotFound is returned for a key that has no checkpoint row.
var ErrNotFound = errkind.NotFound("checkpoint: no checkpoint for key")

// HeldError is returned by Claim when another owner holds a live lease on the key.
type HeldError struct {
	Key   string
	Owner string
	// RetryIn is how long until the lease lapses, measured by the database's clock.
	RetryIn time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("checkpoint %q: held by %s for another %s", e.Key, e.Owner, e.RetryIn.Round(time.Millisecond))
}

// isHeld reports whether err says the key is held by a live owner.
func isHeld(err error) bool {
	var h *HeldError
	return errors.As(err, &h)
}
