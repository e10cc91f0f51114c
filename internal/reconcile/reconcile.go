package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"golang.org/x/time/rate"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/tracing"
)

// Queue is the River queue of the reconciliation job.
const Queue = "stepwise_reconcile"

// Reconciler settles UNKNOWN_EXTERNAL operations by asking the external system about their
// operation_id, and lets people resolve the ones it cannot.
type Reconciler struct {
	db        outbox.DB
	ob        *outbox.Outbox
	config    *Config
	kinds     map[string]*kindState
	kindNames []string
	metrics   *metrics
	tracer    trace.Tracer
}

type kindState struct {
	name        string
	cfg         *KindConfig
	limiter     *rate.Limiter
	maxAttempts int // the outbox's, for "not found after N attempts"
}

// New returns a Reconciler for the kinds in config. db is the pool the River client uses.
func New(db outbox.DB, config *Config) (*Reconciler, error) {
	if db == nil {
		return nil, errors.New("reconcile.New: db is nil; pass the *pgxpool.Pool your River client uses")
	}
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Logger = tracing.Logger(cfg.Logger) // records logged inside a span carry its ids
	r := &Reconciler{db: db, ob: cfg.Outbox, config: cfg, kinds: map[string]*kindState{}, tracer: tracing.Tracer(cfg.TracerProvider)}
	for name, kc := range cfg.Kinds {
		r.kinds[name] = &kindState{name: name, cfg: kc, limiter: newLimiter(kc.RatePerSecond),
			maxAttempts: cfg.Outbox.KindConfig(name).MaxAttempts}
		r.kindNames = append(r.kindNames, name)
	}
	sort.Strings(r.kindNames)
	r.metrics = newMetrics(db, r.kindNames)
	return r, nil
}

// NewResolver returns a Reconciler that records people's decisions (Resolve, ResolveTx)
// through ob, with ob's outcome callbacks, and does nothing else: it has no kinds to look up,
// is never installed, and needs no kind configured but ob's. It is how a client settles kinds
// that no process can look up (no Checker), which only a person can settle.
func NewResolver(db outbox.DB, ob *outbox.Outbox) *Reconciler {
	return &Reconciler{db: db, ob: ob} // all Resolve and ResolveTx use
}

// RunOpts narrows an on-demand pass.
type RunOpts struct {
	// Kind, when set, reconciles this kind only.
	Kind string
	// OperationID, when set, checks this one operation now, whatever its next check time.
	OperationID uuid.UUID
	// Force checks every UNKNOWN_EXTERNAL operation once now, not only those due. The grace
	// period still holds: a not-found answer inside it does not resend.
	Force bool
}

// PassResult counts what a pass did.
type PassResult struct {
	// Checked is the number of lookups made.
	Checked int
	// Lookups counts lookups by result: succeeded, failed, pending, not_found, error.
	Lookups map[string]int
	// Moved counts recorded transitions by the state they moved to.
	Moved map[outbox.State]int
	// Waiting is the number of operations that stay UNKNOWN_EXTERNAL for a later check.
	Waiting int
}

func (p *PassResult) add(q *PassResult) {
	p.Checked += q.Checked
	p.Waiting += q.Waiting
	for k, v := range q.Lookups {
		p.Lookups[k] += v
	}
	for k, v := range q.Moved {
		p.Moved[k] += v
	}
}

func newPassResult() *PassResult {
	return &PassResult{Lookups: map[string]int{}, Moved: map[outbox.State]int{}}
}

// RunOnce runs one reconciliation pass now, over every due UNKNOWN_EXTERNAL operation (or as
// opts narrow it), in batches, until none is left due. It is what the periodic job runs, and
// what a CLI calls to reconcile on demand. Passes that overlap (two processes, a CLI beside the
// periodic job) are safe: each claims its batch with FOR UPDATE SKIP LOCKED and pushes the
// next check time past the lookup, and a decision is recorded only for the check that made it.
func (r *Reconciler) RunOnce(ctx context.Context, opts *RunOpts) (*PassResult, error) {
	if opts == nil {
		opts = &RunOpts{}
	}
	return r.run(ctx, opts, time.Time{})
}

func (r *Reconciler) run(ctx context.Context, opts *RunOpts, deadline time.Time) (*PassResult, error) {
	kinds := r.kindNames
	if opts.Kind != "" {
		if _, ok := r.kinds[opts.Kind]; !ok {
			return nil, fmt.Errorf("%w: %q; configured kinds are %v", outbox.ErrUnknownKind, opts.Kind, r.kindNames)
		}
		kinds = []string{opts.Kind}
	}
	total := newPassResult()
	// A forced pass checks each operation once: those it claimed carry a newer updated_at
	// than its start. The start comes from the database's clock, which stamps updated_at; a
	// worker clock running ahead would otherwise make the pass claim the same operations
	// again and again, each time counting a check toward MaxChecks.
	var start time.Time
	if err := r.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&start); err != nil {
		return total, fmt.Errorf("reading the database clock: %w", err)
	}
	for _, kind := range kinds {
		res, err := r.pass(ctx, r.kinds[kind], opts, start, deadline)
		total.add(res)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// claimHold is how far a claim pushes an operation's next check: past its lookup and its
// recording, so that an overlapping pass leaves it alone, and short enough that the claims of a
// pass that died are checked again soon. In a pass (see pass) a claimed operation has ahead of
// it at most the rest of its batch, the queue and the lookups in flight (B + 2C lookups, in
// rounds of C, each at most Timeout, and at RatePerSecond), then its own lookup, and one
// recording (at most recordTimeout).
//
// One recording, not every recording that can be ahead of it. A decision waits behind at most
// max(B, C) queued decisions and C more held by blocked workers, besides the transaction in
// flight: with B > C (the default is B ≥ 4C) its own recording may come third, after the one in
// flight and one more. When recordings are that slow (three of 10 s and more in a row), an
// overlapping pass may claim an operation whose answer still waits, ask the bank again and
// spend a check; the checks guard records only one of the two answers
// (TestOverlappingPassesProcessEachOperationOnce). Budgeting every recording ahead (up to 2B +
// 3C decisions, when the decisions' queue held C) made the hold five times longer at short
// timeouts (166 s instead of 46 s at Timeout 1 s, BatchSize 100, Concurrency 8), and the claims
// of a pass killed mid-way then waited that long: the chaos drill's slow-bank profile saw 100
// payouts stand UNKNOWN_EXTERNAL, unchecked, for over a minute.
func claimHold(k *KindConfig) time.Duration {
	b, c := k.BatchSize, k.Concurrency
	lookups := time.Duration((b+2*c+c-1)/c+1) * k.Timeout
	if k.RatePerSecond > 0 {
		lookups += time.Duration(float64(b+2*c) / k.RatePerSecond * float64(time.Second))
	}
	return lookups + recordTimeout
}

// claimSQL takes a batch of due UNKNOWN_EXTERNAL operations. It counts the check (checks + 1,
// the guard the decision is recorded under) and pushes next_check_at past the lookups in one
// short statement: nothing stays locked while the external system is asked.
var claimSQL = `
WITH c AS (
	SELECT operation_id FROM stepwise_operation
	WHERE kind = $1 AND state = 'UNKNOWN_EXTERNAL'
		AND ($3::uuid IS NULL OR operation_id = $3)
		AND (next_check_at <= now() OR $3::uuid IS NOT NULL OR ($4 AND updated_at < $5))
	ORDER BY next_check_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE stepwise_operation o SET checks = o.checks + 1, next_check_at = now() + $6::interval, updated_at = now()
FROM c WHERE o.operation_id = c.operation_id
RETURNING ` + outbox.Columns("o") + `, now()`

func (r *Reconciler) lookupOne(ctx context.Context, ks *kindState, op *outbox.Operation) (res LookupResult, err error) {
	lctx, cancel := context.WithTimeout(ctx, ks.cfg.Timeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("querier panicked: %v", p)
		}
	}()
	cp := *op
	return ks.cfg.Checker.Lookup(lctx, &cp)
}

// apply records a batch's decisions in one transaction: the transitions (with the outcome
// callbacks and audit events, through the Outbox), the next check of those that wait, and a
// dispatcher wake for those sent back to RETRYABLE. Every write is guarded by the check that
// claimed the operation, so an overlapping pass that checked it again cannot be overwritten,
// and no callback runs twice. If the batch fails (a callback refusing one operation), each
// operation is tried on its own; one that still fails is checked again after the claim hold.
func (r *Reconciler) apply(ctx context.Context, ks *kindState, ops []*outbox.Operation, ds []decision) ([]outbox.OperationOutcome, int, error) {
	// Record even when the pass is being cancelled: the lookups happened, and what they
	// proved must not be thrown away. WithoutCancel keeps the values, River's client among
	// them, which wakes the dispatcher.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	var moved []outbox.OperationOutcome
	var waiting int
	err := pgx.BeginFunc(actx, r.db, func(tx pgx.Tx) error {
		var err error
		moved, waiting, err = r.applyTx(actx, tx, ks, ops, ds)
		return err
	})
	if err == nil {
		return moved, waiting, nil
	}
	moved, waiting = nil, 0
	var dbErrs []error
	for i := range ops {
		var m []outbox.OperationOutcome
		var w int
		err := pgx.BeginFunc(actx, r.db, func(tx pgx.Tx) error {
			var err error
			m, w, err = r.applyTx(actx, tx, ks, ops[i:i+1], ds[i:i+1])
			return err
		})
		if err != nil {
			dbErrs = append(dbErrs, err)
			r.config.Logger.ErrorContext(ctx, "stepwise reconcile: recording a decision failed; the operation is checked again later",
				slog.String("kind", ks.name), slog.String("operation_id", ops[i].ID.String()), slog.String("error", err.Error()))
			continue
		}
		moved, waiting = append(moved, m...), waiting+w
	}
	if len(dbErrs) == len(ops) {
		return moved, waiting, fmt.Errorf("recording reconciliation decisions of kind %q: %w", ks.name, errors.Join(dbErrs...))
	}
	return moved, waiting, nil
}

func (r *Reconciler) applyTx(ctx context.Context, tx pgx.Tx, ks *kindState, ops []*outbox.Operation, ds []decision) ([]outbox.OperationOutcome, int, error) {
	var (
		ts       []outbox.Move
		stayIDs  []uuid.UUID
		stayChk  []int32
		stayNext []time.Time
		stayLook []string
	)
	for i, op := range ops {
		d := ds[i]
		if d.stay {
			stayIDs, stayChk = append(stayIDs, op.ID), append(stayChk, int32(op.Checks))
			stayNext, stayLook = append(stayNext, d.next), append(stayLook, d.lookup)
			continue
		}
		ts = append(ts, outbox.Move{
			OperationID: op.ID, From: outbox.StateUnknownExternal, To: d.to, Checks: op.Checks,
			Actor: r.config.Actor, ExternalRef: d.ref, Error: d.err, Reason: d.reason, Lookup: d.lookup,
			Detail: map[string]any{"check": op.Checks},
		})
	}
	moved, err := r.ob.MoveTx(ctx, tx, ts)
	if err != nil {
		return nil, 0, err
	}
	waiting := 0
	if len(stayIDs) > 0 {
		tag, err := tx.Exec(ctx, `
			UPDATE stepwise_operation o SET next_check_at = n.next, last_lookup = n.lookup, updated_at = now()
			FROM unnest($1::uuid[], $2::int[], $3::timestamptz[], $4::text[]) AS n(id, checks, next, lookup)
			WHERE o.operation_id = n.id AND o.state = 'UNKNOWN_EXTERNAL' AND o.checks = n.checks`,
			stayIDs, stayChk, stayNext, stayLook)
		if err != nil {
			return nil, 0, fmt.Errorf("scheduling the next checks: %w", err)
		}
		waiting = int(tag.RowsAffected())
	}
	return moved, waiting, nil
}

// reconcileArgs is the periodic River job that runs a reconciliation pass.
type reconcileArgs struct{}

// Kind is the River job kind.
func (reconcileArgs) Kind() string { return "stepwise_reconcile" }

// InsertOpts puts the pass in Queue.
func (reconcileArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Queue, MaxAttempts: 5}
}

type reconcileWorker struct {
	river.WorkerDefaults[reconcileArgs]
	r *Reconciler
}

// Timeout covers a slice plus the longest a claimed operation may wait for its recording when
// the slice ends (claimHold), so that River never cancels a pass that still holds claims.
func (w *reconcileWorker) Timeout(*river.Job[reconcileArgs]) time.Duration {
	longest := time.Duration(0)
	for _, ks := range w.r.kinds {
		longest = max(longest, claimHold(ks.cfg))
	}
	return w.r.config.Slice + longest + time.Minute
}

func (w *reconcileWorker) Work(ctx context.Context, job *river.Job[reconcileArgs]) error {
	_, err := w.r.run(ctx, &RunOpts{}, time.Now().Add(w.r.config.Slice))
	if errors.Is(err, errSliceOver) || (err != nil && ctx.Err() != nil) {
		return river.JobSnooze(0) // more is due: go on right away, without counting an attempt
	}
	return err
}

// addWorkers registers the reconciliation worker on workers.
func (r *Reconciler) addWorkers(workers *river.Workers) error {
	if err := river.AddWorkerSafely[reconcileArgs](workers, &reconcileWorker{r: r}); err != nil {
		return fmt.Errorf("reconcile: Install: adding the reconciler: %w", err)
	}
	return nil
}

// periodicJobs returns the periodic pass. River runs periodic jobs on its elected leader only
// (hence RunMaintenance in every process); passes that still overlap are safe.
func (r *Reconciler) periodicJobs() []*river.PeriodicJob {
	interval := r.config.Interval
	return []*river.PeriodicJob{river.NewPeriodicJob(
		river.PeriodicInterval(interval),
		func() (river.JobArgs, *river.InsertOpts) {
			// Unique per period, not per state: a pass of a killed process stays "running"
			// in River for an hour and must not block the next ones.
			return reconcileArgs{}, &river.InsertOpts{Queue: Queue, MaxAttempts: 5,
				UniqueOpts: river.UniqueOpts{ByPeriod: interval}}
		},
		&river.PeriodicJobOpts{ID: "stepwise_reconcile", RunOnStart: true},
	)}
}

// queues returns the River queue the pass runs in.
func (r *Reconciler) queues() map[string]river.QueueConfig {
	return map[string]river.QueueConfig{Queue: {MaxWorkers: 2}}
}

// Install adds the reconciler's worker, its periodic pass (every Config.Interval) and its
// queue (Queue) to a River client config, before river.NewClient. It is the one way to wire a
// Reconciler; a queue already in the config is left as configured. Then call RunMaintenance in
// every process, and register Metrics with your Prometheus registry.
func (r *Reconciler) Install(rc *river.Config) error {
	if rc == nil {
		return errors.New("reconcile: Install: the River config is nil; pass the *river.Config you give river.NewClient")
	}
	if rc.Workers == nil {
		rc.Workers = river.NewWorkers()
	}
	if err := r.addWorkers(rc.Workers); err != nil {
		return err
	}
	rc.PeriodicJobs = append(rc.PeriodicJobs, r.periodicJobs()...)
	if rc.Queues == nil {
		rc.Queues = map[string]river.QueueConfig{}
	}
	for name, qc := range r.queues() {
		if _, ok := rc.Queues[name]; !ok {
			rc.Queues[name] = qc
		}
	}
	return nil
}

// newLimiter spaces calls evenly at perSecond a second, with no burst: an external system's
// rate limit usually counts per second or finer, and a burst after an idle minute is exactly
// what trips it. 0 means no limit.
func newLimiter(perSecond float64) *rate.Limiter {
	if perSecond <= 0 {
		return rate.NewLimiter(rate.Inf, 1)
	}
	return rate.NewLimiter(rate.Limit(perSecond), 1)
}
