package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/puddle/v2"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Waking a dispatcher after the enqueuing transaction commits.
//
// Enqueue used to queue the dispatcher wake inside the step's transaction: a unique River
// insert, ON CONFLICT … DO UPDATE on the one river_job row of the kind's queued or running
// dispatcher. That row stayed locked from Enqueue until the step committed, so every run
// enqueueing the same kind waited for every other run's open step (measured: run B's step
// blocked 2.27 s on run A's open transaction), and a frozen worker blocked them all for up
// to its stall timeout. It also cost a round trip and a row update per step.
//
// The options weighed:
//
//   - NOTIFY in the step's transaction: PostgreSQL serializes the commits of all
//     transactions that notified, database-wide, on the notification queue's lock, and it
//     needs a listening connection in some process; a process that only enqueues has none.
//   - Skipping the insert when a live dispatcher is known: a running dispatcher may be
//     completing at that very moment (completeIfIdle checked for work before our commit),
//     and the skipped wake would be lost until the next poll. Skipping is only safe when the
//     kind's job is known to be queued and not yet started; the waker does that (below).
//   - A non-unique insert per step: no lock shared between runs, but one River job per step
//     for a loop that needs one per kind, and still a statement in every step.
//   - Waking after the commit (chosen): Enqueue notes the transaction's id, which its INSERT
//     returns in the same round trip, and the client's waker (one goroutine per
//     stepwise.Client, alive only while it has something to wake; see Local) asks PostgreSQL every wakeTick
//     which of the noted transactions have committed, and queues the dispatcher of their
//     kinds in a short transaction of its own, unless the job it queued last for that kind
//     is still waiting to start. Nothing is locked on behalf of the step, the step pays no
//     extra statement, and all the steps committed within one tick share one wake.
//
// Why no wake is lost: the wake is queued only after the operations are committed. If the
// kind's dispatcher is running, River swallows the insert; a dispatcher that then completes
// does so in completeIfIdle, whose check for due work runs after it marked its job completed:
// if the check's snapshot came after our commit it sees the operations and, judging "due" by
// the clock at the check rather than its transaction's start, does not complete; if it came
// before, our insert finds the completed job (or waits on its row until that completion
// commits) and, the job no longer being in a unique state, queues a new one. A running job
// that is known dead (a takeover has heartbeated since) does not count: the wake goes on to a
// takeover named after it (passDeadDispatchers). If the
// process dies between the commit and the wake, the poll (Config.PollInterval: the periodic
// job on River's leader, and Outbox.RunMaintenance in every process that runs it) finds the
// PENDING operations, as it always did.
const (
	// wakeTick is how long the waker waits between two looks at the noted transactions: the
	// wake's added latency, and the rate at which an enqueueing process queries for it.
	wakeTick = 20 * time.Millisecond
	// wakeWaitingMax bounds the waker's back-off while every wake it has to make would go to
	// a dispatcher job it queued that is still waiting to start (its queue's workers are busy,
	// or this process runs none): each look then doubles the wait before the next, from
	// wakeTick to this. Such a job delivers every commit before its start, so the looks in
	// between only confirm that it still waits: one statement per step at one payout per step
	// (the bench's B=1 traced it at 0.32 statements and 5 % of a step's time). The cost is
	// latency once, when that job has started and completed between two looks: the next
	// commit's wake waits for the next look, at most this long (the poll remains the net).
	wakeWaitingMax = 160 * time.Millisecond
	// wakeAttempts is how many times in a row the waker tries a failing database before it
	// drops what it holds (about 150ms) with a warning: the poll delivers those operations,
	// and a dead database must not pin a goroutine. A closed pool (the process shutting
	// down) is not retried at all.
	wakeAttempts = 3
)

// pendingWake is a transaction that enqueued operations of kinds. xid is empty when there is
// nothing to wait for (the operations were already committed).
type pendingWake struct {
	xid   string
	kinds []string
}

// waker wakes the dispatchers of one client's kinds once the transactions that enqueued
// them commit. It belongs to a Local, hence to one stepwise.Client; nothing process-wide
// finds it.
type waker struct {
	mu      sync.Mutex
	client  *river.Client[pgx.Tx] // the client wakes are queued through: WakeThrough's, else the first wake's; set under mu
	fixed   bool                  // client was set by WakeThrough: a job's own client does not replace it
	pending []pendingWake         // guarded by mu
	running bool                  // a loop goroutine is running; guarded by mu
	// queued is, per kind, the dispatcher job this waker's last insert queued or found;
	// used by the loop goroutine only (one at a time: running).
	queued map[string]int64
	// looks counts the waker's looks (one statement each), for the tests of its back-off.
	looks atomic.Int64
}

// wakeAfterCommit arranges for the dispatchers of kinds to be woken once the transaction xid
// commits (at once when xid is empty), through the waker's client: WakeThrough's, whatever
// client the caller runs in, or else the first caller's. It reports false when that client
// cannot run statements of its own (a River driver without a pool), or when client is not the
// one this waker wakes through: the caller must then wake in its transaction.
func (w *waker) wakeAfterCommit(client *river.Client[pgx.Tx], xid string, kinds []string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.fixed:
		// The wake goes through WakeThrough's client.
	case w.client == nil:
		if !client.Driver().PoolIsSet() {
			return false
		}
		w.client = client
	case w.client != client:
		return false
	}
	w.pending = append(w.pending, pendingWake{xid: xid, kinds: kinds})
	if !w.running {
		w.running = true
		go w.loop()
	}
	return true
}

// loop runs until nothing is pending, then ends (the next Enqueue starts it again), so that
// an idle process, or a test that is over, has no goroutine left behind.
func (w *waker) loop() {
	failures := 0
	delay := wakeTick
	for {
		time.Sleep(delay)
		w.mu.Lock()
		batch := w.pending
		w.pending = nil
		if len(batch) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()

		keep, waiting, err := w.wake(batch)
		switch {
		case err == nil && waiting:
			failures, delay = 0, min(2*delay, wakeWaitingMax)
		case err == nil:
			failures, delay = 0, wakeTick
		case errors.Is(err, puddle.ErrClosedPool):
			// The process is shutting down: its pool was closed after its client stopped,
			// often a moment after a step committed. Nothing is lost (the operations are
			// committed PENDING, and the poll of any running process, or of this one's next
			// start, delivers them), so it is not a warning: a WARN on every clean shutdown
			// would teach the people on call to ignore the outbox's warnings.
			slog.Default().Info("stepwise outbox: the pool is closed; dropping the dispatcher wakes of committed transactions, the poll delivers their operations",
				slog.Int("transactions", len(keep)))
			keep, failures, delay = nil, 0, wakeTick
		case failures+1 < wakeAttempts:
			failures++
			delay = time.Duration(1<<failures) * wakeTick
		default:
			// The poll will find these operations; a dead pool must not pin this goroutine.
			slog.Default().Warn("stepwise outbox: giving up waking dispatchers after the commit; the poll will find the operations",
				slog.Int("transactions", len(keep)), slog.String("error", err.Error()))
			keep, failures, delay = nil, 0, wakeTick
		}
		if len(keep) > 0 {
			w.mu.Lock()
			w.pending = append(keep, w.pending...)
			w.mu.Unlock()
		}
	}
}

// wake queues the dispatchers of the kinds whose transactions committed and returns the
// entries still to wait for (or all of them, with an error). allWaiting reports that it
// queued nothing because every kind it holds, of committed and running transactions alike,
// has a dispatcher job this waker queued still waiting to start (the loop then backs off:
// wakeWaitingMax).
func (w *waker) wake(batch []pendingWake) (keep []pendingWake, allWaiting bool, err error) {
	w.looks.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	xids := make([]string, 0, len(batch))
	for _, p := range batch {
		if p.xid != "" && !slices.Contains(xids, p.xid) {
			xids = append(xids, p.xid)
		}
	}
	known := make([]int64, 0, len(w.queued))
	for _, id := range w.queued {
		known = append(known, id)
	}
	// One round trip answers three questions:
	//  - Which noted transactions are still running? "Visible in our snapshot" rather than
	//    pg_xact_status alone: the commit log says committed a moment before other
	//    snapshots see the rows, and a dispatcher must see them once we call them committed.
	//  - Which of the finished ones rolled back? Their operations vanished with them.
	//  - Which dispatcher jobs this waker queued earlier are still waiting to start
	//    (available, scheduled or retryable)? Such a job starts after these commits and
	//    delivers what they wrote: waking again would only rewrite its row (and flush WAL)
	//    to no effect. A running job is not enough: it may be completing right now with a
	//    check for work that came before our commit, so it gets the insert.
	var running, rolledBack []string
	var waiting []int64
	if err := w.client.Driver().GetExecutor().QueryRow(ctx, `
		WITH x AS (
			SELECT x, pg_visible_in_snapshot(x::xid8, pg_current_snapshot()) AS ended FROM unnest($1::text[]) AS x
		)
		SELECT coalesce((SELECT array_agg(x) FROM x WHERE NOT ended), '{}'),
			coalesce((SELECT array_agg(x) FROM x WHERE ended AND pg_xact_status(x::xid8) = 'aborted'), '{}'),
			coalesce((SELECT array_agg(id) FROM river_job WHERE id = ANY($2::bigint[])
				AND state IN ('available', 'scheduled', 'retryable')), '{}')`, xids, known).Scan(&running, &rolledBack, &waiting); err != nil {
		return batch, false, fmt.Errorf("reading the status of %d enqueueing transactions: %w", len(xids), err)
	}
	var kinds []string
	// Whether every kind to wake, of the transactions still running too, has a job that is
	// still waiting to start: nothing to do but let it start, and the loop backs off.
	allWaiting = true
	queuedWaiting := func(k string) bool {
		id, ok := w.queued[k]
		return ok && slices.Contains(waiting, id)
	}
	for _, p := range batch {
		switch {
		case p.xid != "" && slices.Contains(running, p.xid):
			keep = append(keep, p)
			for _, k := range p.kinds {
				allWaiting = allWaiting && queuedWaiting(k)
			}
		case p.xid != "" && slices.Contains(rolledBack, p.xid):
			// Rolled back: its operations vanished with it, nothing to deliver.
		default:
			for _, k := range p.kinds {
				if queuedWaiting(k) {
					continue // that kind's dispatcher has yet to start: it will see these rows
				}
				kinds = append(kinds, k)
			}
		}
	}
	if len(kinds) == 0 {
		return keep, allWaiting, nil
	}
	// A fixed order, so that two wakers (two processes) lock the jobs of the same kinds in
	// the same order and cannot deadlock each other.
	slices.Sort(kinds)
	kinds = slices.Compact(kinds)
	params := make([]river.InsertManyParams, len(kinds))
	for i, k := range kinds {
		params[i] = river.InsertManyParams{Args: dispatchArgs{OperationKind: k}}
	}
	res, err := w.client.InsertMany(ctx, params)
	if err != nil {
		return batch, false, fmt.Errorf("queueing the dispatcher for %v: %w", kinds, err)
	}
	for i, r := range res {
		if r == nil || r.Job == nil || i >= len(kinds) {
			continue
		}
		if r, err = w.passDeadDispatchers(ctx, kinds[i], r); err != nil {
			return batch, false, err
		}
		w.queued[kinds[i]] = r.Job.ID
	}
	return keep, false, nil
}

// passDeadDispatchers makes sure the wake of kind reached a dispatcher that is alive. res is
// the wake's insert. A wake swallowed by a "running" job is enough when that job is the kind's
// live dispatcher: its completeIfIdle sees the committed rows. But River keeps the job of a
// killed dispatcher "running" for up to an hour, and every plain wake of the kind is a
// duplicate of that job meanwhile. The poll starts a takeover once the dead job's heartbeat is
// stale; but once that takeover has delivered and completed, the dead job swallows the next
// wake again, and without this each operation waited for the takeover's heartbeat to go stale
// plus a poll (about DispatcherLease + PollInterval each, against tens of milliseconds).
//
// A running job is known to be dead when stepwise_outbox_dispatcher names a later job of the
// kind: a takeover, started because this one stopped heartbeating, has heartbeated since. Then
// the wake is inserted as a takeover named after it, which the completed takeover does not
// swallow (and a running takeover does, being alive); a takeover that died too is followed
// the same way, as the poll does. A job that merely stalled and then beats again names itself
// once more and counts as alive. A wrong guess costs an extra dispatcher beside a live one,
// which is safe (claims skip locked rows, outcomes are fenced by claim); it never loses a
// wake. Right after a kill, before any takeover has heartbeated, the dead job cannot be told
// from a live one here: that first wake waits for the poll's takeover, as before.
func (w *waker) passDeadDispatchers(ctx context.Context, kind string, res *rivertype.JobInsertResult) (*rivertype.JobInsertResult, error) {
	for hop := 0; hop < 100 && res.UniqueSkippedAsDuplicate && res.Job.State == rivertype.JobStateRunning; hop++ {
		var superseded bool
		if err := w.client.Driver().GetExecutor().QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM stepwise_outbox_dispatcher WHERE kind = $1 AND river_job_id > $2)`,
			kind, res.Job.ID).Scan(&superseded); err != nil {
			return res, fmt.Errorf("reading the heartbeat of the dispatcher of kind %q: %w", kind, err)
		}
		if !superseded {
			return res, nil
		}
		next, err := w.client.Insert(ctx, dispatchArgs{OperationKind: kind, Takeover: res.Job.ID}, nil)
		if err != nil {
			return res, fmt.Errorf("queueing a dispatcher of kind %q past dead job %d: %w", kind, res.Job.ID, err)
		}
		res = next
	}
	return res, nil
}
