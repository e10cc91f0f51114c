// Package memwatch measures how much heap a piece of code holds at its worst, for benchmarks
// whose target is memory that does not grow with the input (a day's totals, say).
package memwatch

import (
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// HeapPeak runs f, sampling the heap's objects every millisecond, and returns their peak above
// what was live before f (after a GC): what f allocated and still held, or had not yet been
// swept, at its worst. It can over-state what f holds (garbage not yet swept counts), never
// under-state it by more than what f allocated and dropped between two samples. What the
// caller holds when it calls (an input handed to f) is in the baseline, not in the result.
func HeapPeak(f func()) uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	runtime.GC()
	base := read()
	var peak atomic.Uint64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if v := read(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	f()
	// The sampler stops before the last read, so that a sample it took earlier cannot
	// overwrite it.
	close(done)
	<-stopped
	p := max(peak.Load(), read())
	if p > base {
		return p - base
	}
	return 0
}
