package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Heartbeat renews l every interval until stopped (protocol step 3). If the lease is fenced,
// or cannot be renewed before it would lapse (database unreachable, connection cut), it
// calls lost once with the reason, so the caller can cancel the step promptly. The fence in
// Advance is what makes a lost lease safe; the heartbeat only makes the loss prompt.
//
// Deadlines here are measured as elapsed time on this worker's monotonic clock since the
// last renewal the database confirmed, which can only err on the side of stopping early.
func (s *Store) Heartbeat(ctx context.Context, l *Lease, interval time.Duration, lost func(error)) (stop func()) {
	if interval <= 0 || interval >= s.cfg.Lease {
		interval = s.cfg.Lease / 3
	}
	// The renewals' connection opens while the first interval passes, not in the first
	// renewal's budget (renewer).
	s.renewals.warm()
	l.heartbeats.Store(true)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lastOK := time.Now()
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			// Leave a margin of one interval: a renewal that succeeds after the lease
			// lapsed would be too late, someone may have claimed in between (and then
			// the renewal is fenced anyway).
			budget := s.cfg.Lease - interval - time.Since(lastOK)
			if budget <= 0 {
				// Out of time (this process was frozen, or the database unreachable).
				// One last fenced renewal tells a takeover (ErrFenced) from a lapse.
				rctx, rcancel := context.WithTimeout(ctx, interval)
				err := s.Renew(rctx, l)
				rcancel()
				if err == nil {
					lastOK = time.Now()
					continue
				}
				if !errors.Is(err, ErrFenced) {
					err = fmt.Errorf("lease could not be renewed before it lapsed: %w", err)
				}
				lost(err)
				return
			}
			rctx, rcancel := context.WithTimeout(ctx, budget)
			err := s.Renew(rctx, l)
			rcancel()
			switch {
			case err == nil:
				lastOK = time.Now()
			case errors.Is(err, ErrFenced):
				lost(err)
				return
			case ctx.Err() != nil:
				return
			}
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		l.heartbeats.Store(false)
	}
}
