package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepwise-go/stepwise/internal/faultpoint"
)

// The dispatcher's pump as it was before the recorder gathered outcomes and claimed ahead
// (one recording transaction at a time, fed through a hand-off of two batches), kept for
// BenchmarkDeliverSlowBank to measure the new one against it in the same process.

// DrainLegacy is Drain with the earlier pump.
func DrainLegacy(ctx context.Context, o *Outbox, kind string) (int, error) {
	ks, ok := o.kinds[kind]
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrUnknownKind, kind)
	}
	if _, err := o.recoverExpired(ctx, ks); err != nil {
		return 0, err
	}
	total := 0
	for {
		n, err := o.pumpLegacy(ctx, ks, time.Now().Add(24*time.Hour), false)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

const legacyFlushDelay = 20 * time.Millisecond

// pump delivers operations of one kind as a pipeline: it claims a batch whenever no more
// than a batch (or Concurrency) of claimed operations is still outstanding, hands them to
// Concurrency senders, and records outcomes in transactions of up to BatchSize as they come
// back, on a recorder goroutine of its own. A slow send so holds up its own operation only, never a batch, and the round
// trips of claiming and recording overlap with sending.
//
// It stops claiming when nothing is due, when once is set and one batch was claimed, at the
// deadline, or when ctx ends; it returns once every claimed operation is recorded (or left
// PROCESSING for crash recovery, by a fault point), with the number it claimed.
func (o *Outbox) pumpLegacy(ctx context.Context, ks *kindState, deadline time.Time, once bool) (int, error) {
	ks.mu.Lock()
	expiryDue := time.Since(ks.lastExpiry) > expiryEvery
	ks.mu.Unlock()
	if expiryDue {
		if _, err := o.recoverExpired(ctx, ks); err != nil {
			return 0, err
		}
	}

	b, c := ks.cfg.BatchSize, ks.cfg.Concurrency
	work := make(chan *Operation, 2*b+c)
	results := make(chan delivered, 2*b+c)
	var senders sync.WaitGroup
	for range c {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for op := range work {
				results <- delivered{op: op, r: o.sendIfRunning(ctx, ks, op)}
			}
		}()
	}
	stopRenewing := o.renewLeases(ctx, ks)
	defer func() {
		close(work)
		senders.Wait()
		stopRenewing()
	}()

	// Recording runs beside claiming and sending, on its own connection, so that neither
	// round trip waits for the other. Two batches may queue for it; then the pump waits.
	var (
		recordFailed atomic.Bool
		recordErrs   []error
		recordMu     sync.Mutex
		toRecord     = make(chan []delivered, 2)
		recorded     = make(chan struct{})
	)
	go func() {
		defer close(recorded)
		for batch := range toRecord {
			if err := o.record(ctx, ks, batch); err != nil {
				recordFailed.Store(true)
				recordMu.Lock()
				recordErrs = append(recordErrs, err)
				recordMu.Unlock()
			}
		}
	}()

	var (
		claimed, outstanding int
		done                 []delivered
		exhausted            bool
		errs                 []error
	)
	flushTimer := time.NewTimer(time.Hour)
	defer flushTimer.Stop()
	flush := func() {
		if len(done) > 0 {
			toRecord <- done
			done = make([]delivered, 0, b)
		}
	}
	for {
		if ctx.Err() != nil || !time.Now().Before(deadline) || (once && claimed > 0) || recordFailed.Load() || o.draining.Load() {
			// Past the deadline, stopping, or the database is failing us: claim no more,
			// finish what we hold.
			exhausted = true
		}
		if !exhausted && outstanding <= max(c, b) {
			ops, err := o.claim(ctx, ks)
			switch {
			case err != nil:
				errs = append(errs, err)
				exhausted = true
			case len(ops) == 0:
				exhausted = true
			default:
				claimed += len(ops)
				// The claim is committed: from here a crash leaves these operations
				// PROCESSING until their lease expires, and then UNKNOWN_EXTERNAL.
				if err := faultpoint.Hit(faultpoint.AfterProcessing); err != nil {
					errs = append(errs, err)
					exhausted = true
					break
				}
				outstanding += len(ops)
				for _, op := range ops {
					work <- op
				}
			}
		}
		if outstanding == 0 {
			flush()
			if exhausted {
				break
			}
			continue
		}
		var flushC <-chan time.Time
		if len(done) > 0 {
			flushC = flushTimer.C
		}
		select {
		case d := <-results:
			outstanding--
			ks.book.release(d.op)
			o.metrics.sent(ks.name, d.r)
			if !d.r.abandoned { // an abandoned one stands for a crash: it stays PROCESSING
				done = append(done, d)
				if len(done) == 1 {
					flushTimer.Reset(legacyFlushDelay)
				}
			}
		case <-flushC:
			flush()
		}
		if len(done) >= b || (outstanding == 0 && len(done) > 0) {
			flush()
		}
	}
	close(toRecord)
	<-recorded
	errs = append(errs, recordErrs...)
	if claimed > 0 {
		if err := faultpoint.Hit(faultpoint.AfterOutcomeCommit); err != nil {
			errs = append(errs, err)
		}
	}
	return claimed, errors.Join(errs...)
}
