package memwatch_test

import (
	"testing"

	"github.com/stepwise-go/stepwise/internal/memwatch"
)

var held []byte

// What f still holds when it returns counts, even when no sample fell after the allocation;
// what the caller held before does not.
func TestHeapPeak(t *testing.T) {
	const size = 32 << 20
	input := make([]byte, size)
	if got := memwatch.HeapPeak(func() { _ = input[size-1] }); got >= size/2 {
		t.Errorf("HeapPeak of a func that only reads its input: %d bytes, want well under the input's %d", got, size)
	}
	if got := memwatch.HeapPeak(func() { held = make([]byte, size) }); got < size {
		t.Errorf("HeapPeak of a func that allocates and keeps %d bytes: %d", size, got)
	}
	held = nil
}
