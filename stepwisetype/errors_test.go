package stepwisetype_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stepwise-go/stepwise/checkpoint"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
)

// One "not found" and one "changed" for a caller who does not care which package said it,
// while each package's sentinel still names what was missing and matches only itself.
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
	for _, sentinel := range []error{workflow.ErrRunChanged, outbox.ErrStateChanged} {
		err := fmt.Errorf("resolving: %w", sentinel)
		if !errors.Is(err, stepwisetype.ErrChanged) || errors.Is(err, stepwisetype.ErrNotFound) {
			t.Errorf("%v: does not match ErrChanged alone", sentinel)
		}
	}
}
