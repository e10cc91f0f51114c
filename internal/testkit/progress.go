package testkit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// progressSeen is the last time any WaitProgress in this process saw its progress move, and
// what it was waiting for: Main's note before the package timeout reads it.
var progressSeen struct {
	sync.Mutex
	what string
	at   time.Time
}

func noteProgress(what string, at time.Time) {
	progressSeen.Lock()
	defer progressSeen.Unlock()
	if at.After(progressSeen.at) {
		progressSeen.what, progressSeen.at = what, at
	}
}

func lastProgress() (what string, at time.Time) {
	progressSeen.Lock()
	defer progressSeen.Unlock()
	return progressSeen.what, progressSeen.at
}

// StallTimeoutDefault is how long WaitProgress lets the work stand still before it fails.
const StallTimeoutDefault = time.Minute

// WaitProgress waits until done reports true. It fails the test only when the work stops
// moving: when progress (a count that grows as the system works: steps committed, operations
// at rest, events written) has not grown for stall (StallTimeoutDefault when zero), or after
// maxWait in all (30 minutes when zero), a bound only for a system that moves forever.
//
// Guards against: a test that fails for time rather than for a bug. A fixed deadline that
// holds on a quiet machine expires on a loaded one while the system is still making
// progress (a CI machine running other builds, a developer's laptop on battery); a stall
// deadline fails only when nothing moves, which is the bug the wait exists to catch.
func WaitProgress(t testing.TB, what string, stall, maxWait time.Duration, check func(ctx context.Context) (done bool, progress int64, err error)) {
	t.Helper()
	if stall <= 0 {
		stall = StallTimeoutDefault
	}
	if maxWait <= 0 {
		maxWait = 30 * time.Minute
	}
	began := time.Now()
	last, lastMoved := int64(-1), time.Now()
	var lastErr error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), stall)
		done, progress, err := check(ctx)
		cancel()
		if err == nil && done {
			return
		}
		lastErr = err
		if err == nil && progress != last {
			last, lastMoved = progress, time.Now()
			noteProgress(what, lastMoved)
		}
		if since := time.Since(lastMoved); since > stall {
			t.Fatalf("%s: no progress for %s (progress stands at %d after %s; last error: %v)",
				what, stall, last, time.Since(began).Round(100*time.Millisecond), lastErr)
		}
		if time.Since(began) > maxWait {
			t.Fatalf("%s: not done after %s though still moving (progress %d; last error: %v)",
				what, maxWait, last, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
