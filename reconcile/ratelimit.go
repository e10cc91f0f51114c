package reconcile

import (
	"context"
	"sync"
	"time"
)

// limiter spaces lookups evenly at a rate per second, without bursts, like the outbox's
// sends: a backlog reconciled after an outage must not trip the rate limit of the external
// system that just came back.
type limiter struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time
}

// newLimiter returns a limiter for perSecond calls a second, or nil (no limit) for 0.
func newLimiter(perSecond float64) *limiter {
	if perSecond <= 0 {
		return nil
	}
	return &limiter{interval: time.Duration(float64(time.Second) / perSecond)}
}

// wait blocks until the caller may make its call, or ctx ends.
func (l *limiter) wait(ctx context.Context) error {
	if l == nil {
		return ctx.Err()
	}
	l.mu.Lock()
	now := time.Now()
	at := l.next
	if at.Before(now) {
		at = now
	}
	l.next = at.Add(l.interval)
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
