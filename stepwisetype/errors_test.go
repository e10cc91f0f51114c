package stepwisetype_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// One "not found" and one "changed" for every caller (the public packages export no sentinel
// of their own for these), while each internal sentinel still names what was missing in its
// message and matches only itself.
func TestOneNotFoundOneChanged(t *testing.T) {
	notFound := []error{workflow.ErrRunNotFound, outbox.ErrNotFound, schedule.ErrNotFound, schedule.ErrSlotNotFound, checkpoint.ErrNotFound}
	for _, sentinel := range notFound {
		err := fmt.Errorf("reading %q: %w", "settle/2026-11-30", sentinel)
		if !errors.Is(err, stepwisetype.ErrNotFound) || !errors.Is(err, sentinel) {
			t.Errorf("%v: errors.Is(ErrNotFound) = %v, errors.Is(own) = %v", sentinel, errors.Is(err, stepwisetype.ErrNotFound), errors.Is(err, sentinel))
		}
		if errors.Is(err, stepwisetype.ErrChanged) {
			t.Errorf("%v matches ErrChanged", sentinel)
		}
	}
	if errors.Is(workflow.ErrRunNotFound, outbox.ErrNotFound) {
		t.Error("a run not found matches an operation not found")
	}
	// The typed errors that say what the thing is now match ErrChanged by themselves, not only
	// when the client wraps them.
	for _, sentinel := range []error{workflow.ErrRunChanged, outbox.ErrStateChanged, &workflow.RunChangedError{Key: "k"}, &outbox.StateChangedError{}} {
		err := fmt.Errorf("resolving: %w", sentinel)
		if !errors.Is(err, stepwisetype.ErrChanged) || errors.Is(err, stepwisetype.ErrNotFound) {
			t.Errorf("%v: does not match ErrChanged alone", sentinel)
		}
	}
}
