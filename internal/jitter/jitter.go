// Package jitter spreads waits and retry delays at random, so that many processes started
// together do not poll, retry or snooze in step.
package jitter

import (
	"math/rand/v2"
	"time"
)

// Spread returns d spread uniformly over ±frac of itself: Spread(d, 0.25) is in [0.75d, 1.25d).
func Spread(d time.Duration, frac float64) time.Duration {
	return time.Duration(float64(d) * (1 - frac + 2*frac*rand.Float64()))
}

// Doubling is a retry back-off: first doubled for each try after the first (try 1 waits first),
// capped at max, then spread by ±25% so that what failed together does not return together.
func Doubling(first, max time.Duration, try int) time.Duration {
	d := first
	for i := 1; i < try && d < max; i++ {
		d *= 2
	}
	return Spread(min(d, max), 0.25)
}

// UpTo returns a duration drawn uniformly from [0, max), or 0 when max is not positive.
func UpTo(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(max)))
}
