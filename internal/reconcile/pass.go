package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/outbox"
)

// recordLinger is how long the recorder waits, after the first decision it holds, for more to
// record in the same transaction, unless it holds BatchSize already. At a low lookup rate
// (Concurrency 8 at a bank answering in 100 ms: 80 a second) it makes a transaction of about
// eight decisions instead of one each; at a high one the recording transaction itself takes
// longer than this, and the decisions that arrived meanwhile go into the next, up to
// BatchSize (the rest into the one after).
const recordLinger = 100 * time.Millisecond

// recordTimeout bounds one recording transaction (apply, its one-by-one retry included): the
// lookups happened, and what they proved is recorded even when the pass is cancelled, but not
// forever.
const recordTimeout = 30 * time.Second

// claimed is one operation a claim took, with the claim's clock.
type claimed struct {
	op  *outbox.Operation
	now func() time.Time
}

// checked is one operation with what its lookup proves.
type checked struct {
	op *outbox.Operation
	d  decision
}

// pass reconciles one kind: a claimer takes due operations BatchSize at a time and hands them to
// Concurrency lookup workers; a recorder records the decisions as they arrive, in transactions
// of what arrived while the last one committed, at most BatchSize each. The three overlap: the
// next claim is made while the last batch is still being looked up, and lookups go on while
// decisions are recorded.
//
// Guards against: a pass that claims a batch, waits for its slowest lookup, records it and only
// then claims the next. The bank's limit (Concurrency / latency) was then out of reach at any
// size: over a day of 1,000,000 payouts on a 2-core machine, at a bank answering in 100 ms,
// 0.64 of it at Concurrency 64 and 0.57 at 256 (batch 1,024; 0.28 with batches of 100).
//
// What it keeps: every decision is recorded under the check its claim counted (see applyTx), so
// overlapping passes cannot overwrite each other; what was looked up is recorded even when ctx
// ends (apply records under WithoutCancel); a deadline stops the claiming, not the recording.
func (r *Reconciler) pass(ctx context.Context, ks *kindState, opts *RunOpts, passStart, deadline time.Time) (*PassResult, error) {
	c := ks.cfg.Concurrency
	// The queues are bounded so that claimHold can bound an operation's wait from its claim to
	// its lookup (see there): a claimed operation has at most the rest of its batch, todo and
	// the lookups in flight ahead of it. done holds a batch of decisions (at least
	// Concurrency), so that the lookups go on while the recorder's transaction commits, for
	// up to a batch's worth of lookups (BatchSize / rate: 400 ms at 256 in flight, a batch of
	// 1,024 and 100 ms a lookup); the recorder takes what waits, up to a batch, per
	// transaction. Where BatchSize ≤ Concurrency nothing changes.
	//
	// Guards against: lookups stalled behind the recorder. With done only Concurrency deep, it
	// filled in Concurrency / rate (100 ms at 256 in flight and 100 ms a lookup), and every
	// recording transaction longer than that blocked every lookup worker until it committed:
	// the recorder busy only part of the time, the bank's limit out of reach all the same
	// (bench bigday at 256, batch 1,024, on a host that spent 326-390 µs of database CPU a
	// lookup: 0.61-0.71 of the limit over five runs, the recorder busy 57-62% of the pass;
	// 0.72-0.83 with this queue and the recorder busy 62-74%, the two builds alternating).
	todo := make(chan claimed, c)
	done := make(chan checked, max(c, ks.cfg.BatchSize))

	// The claimer. stopped ends it early, after a recording failed: nothing more is claimed,
	// and the operations claimed but not yet asked about are not asked (they are checked
	// again after the claim's hold, as when a pass dies); answers already received are still
	// recorded.
	stopped := make(chan struct{})
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopped) }) }
	var claimErr error
	go func() {
		defer close(todo)
		for {
			select {
			case <-stopped:
				return
			default:
			}
			if !deadline.IsZero() && time.Now().After(deadline) {
				claimErr = errSliceOver
				return
			}
			ops, now, err := r.claim(ctx, ks, opts, passStart)
			if err != nil {
				claimErr = err
				return
			}
			for _, op := range ops {
				todo <- claimed{op: op, now: now} // the workers drain todo until it closes
			}
			if len(ops) == 0 || opts.OperationID != uuid.Nil {
				return
			}
		}
	}()

	// The lookup workers. lctx is ctx, cancelled only when the recorder panics.
	lctx, cancelLookups := context.WithCancel(ctx)
	defer cancelLookups()
	var workers sync.WaitGroup
	for range c {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for cl := range todo {
				select {
				case <-stopped:
					continue // drain todo without asking: the pass is failing
				default:
				}
				done <- checked{op: cl.op, d: r.check(lctx, ks, cl.op, cl.now)}
			}
		}()
	}
	go func() { workers.Wait(); close(done) }()
	// A panic while recording (an outcome callback's bug) must not leave the claimer, the
	// workers and their claimed operations blocked forever on queues nobody reads: stop,
	// cancel the lookups, let everything drain, then let the panic go on (River's executor
	// recovers a job's panic and fails the attempt).
	defer func() {
		if p := recover(); p != nil {
			stop()
			cancelLookups()
			for range done {
			}
			panic(p)
		}
	}()

	// The recorder, in this goroutine.
	res := newPassResult()
	var recErr error
	var ops []*outbox.Operation
	var ds []decision
	record := func() {
		moved, waiting, err := r.apply(ctx, ks, ops, ds)
		res.Waiting += waiting
		for _, oo := range moved {
			res.Moved[oo.Outcome.To]++
		}
		if err != nil && recErr == nil {
			recErr = err
			stop()
		}
		ops, ds = ops[:0], ds[:0]
	}
	take := func(ch checked) {
		ops, ds = append(ops, ch.op), append(ds, ch.d)
		res.Checked++
		res.Lookups[ch.d.result]++
		r.metrics.lookup(ks.name, ch.d.result)
	}
	for first := range done {
		take(first)
		linger := time.NewTimer(recordLinger)
	gather:
		for len(ops) < ks.cfg.BatchSize {
			select {
			case ch, ok := <-done:
				if !ok {
					break gather
				}
				take(ch)
			case <-linger.C:
				break gather
			}
		}
		linger.Stop()
		record()
	}
	if recErr != nil {
		return res, recErr
	}
	return res, claimErr
}

// claim takes up to BatchSize due operations of the kind (or the one opts names) and returns
// them with a clock that reads the database's time: a worker whose clock runs fast must not
// cut a grace period short.
func (r *Reconciler) claim(ctx context.Context, ks *kindState, opts *RunOpts, passStart time.Time) ([]*outbox.Operation, func() time.Time, error) {
	var only *uuid.UUID
	if opts.OperationID != uuid.Nil {
		only = &opts.OperationID
	}
	rows, err := r.db.Query(ctx, claimSQL, ks.name, ks.cfg.BatchSize, only, opts.Force, passStart, claimHold(ks.cfg))
	if err != nil {
		return nil, nil, fmt.Errorf("claiming unknown operations of kind %q: %w", ks.name, err)
	}
	var dbNow time.Time
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*outbox.Operation, error) {
		return outbox.ScanOperation(row, &dbNow)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("claiming unknown operations of kind %q: %w", ks.name, err)
	}
	claimedAt := time.Now()
	return ops, func() time.Time { return dbNow.Add(time.Since(claimedAt)) }, nil
}

// check asks the external system about one operation, within the kind's rate, and decides what
// the answer proves. Its span, in the reconciler's trace, links to the span that enqueued the
// operation and ends with the decision.
func (r *Reconciler) check(ctx context.Context, ks *kindState, op *outbox.Operation, now func() time.Time) decision {
	ctx, span := r.tracer.Start(ctx, "stepwise.check")
	var res LookupResult
	err := ks.limiter.Wait(ctx)
	if err == nil {
		res, err = r.lookupOne(ctx, ks, op)
	}
	d := decide(op, res, err, now(), ks.cfg, ks.maxAttempts)
	endCheckSpan(span, ks.name, op, d, err)
	return d
}

var errSliceOver = errors.New("reconcile: slice over")
