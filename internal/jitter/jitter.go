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

// UpTo returns a duration drawn uniformly from [0, max), or 0 when max is not positive.
func UpTo(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(max)))
}
