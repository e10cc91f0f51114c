package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/tracing"
)

// Defaults of Config's fields, which ConfigWithDefaults applies to zero fields. Heartbeat defaults
// to Lease/3 and StallTimeout to Lease; MaintenanceQueue to river.QueueDefault.
const (
	LeaseDefault               = 30 * time.Second
	SliceDefault               = time.Minute
	LockTimeoutDefault         = 250 * time.Millisecond
	MaintenanceIntervalDefault = time.Second
)

// RiverRescueStuckJobsAfterDefault is River's default river.Config.RescueStuckJobsAfter (an
// hour; JobTimeout plus an hour when JobTimeout is set), which Install assumes when the
// config leaves it zero. River keeps the constant internal.
const RiverRescueStuckJobsAfterDefault = time.Hour

// Config configures an Engine.
type Config struct {
	// Lease is how long a worker keeps a run between renewals. A worker killed mid-run,
	// holding its lease, is taken over after about Lease + MaintenanceInterval; one killed in
	// the milliseconds when it holds none (fetched and not yet claimed, released and not yet
	// recorded by River) after about 2 × Lease + MaintenanceInterval. Defaults to
	// LeaseDefault (30s).
	Lease time.Duration

	// Heartbeat is how often a running step renews its lease. Must be shorter than Lease.
	// Defaults to Lease/3.
	Heartbeat time.Duration

	// Slice is how long one River attempt runs steps before it releases the lease and snoozes
	// (JobSnooze(0)), so a long run never looks stuck to River and other runs get their turn.
	// Must be shorter than the river.Config's RescueStuckJobsAfter, which Install checks.
	// Defaults to 1m.
	Slice time.Duration

	// StallTimeout is the idle_in_transaction_session_timeout of step transactions: a worker
	// frozen inside a step has its transaction killed by the server after this long.
	// Defaults to Lease.
	StallTimeout time.Duration

	// LockTimeout bounds how long a claim waits for the checkpoint row. Defaults to 250ms.
	LockTimeout time.Duration

	// MaintenanceInterval is how often the leader looks for runs whose worker died (lease
	// expired, River job still running) and re-enqueues them. Defaults to 1s.
	MaintenanceInterval time.Duration

	// MaintenanceQueue is the River queue of the maintenance job. The client that should run
	// maintenance (every client may; the leader inserts it) must work this queue: Install
	// adds it to a river.Config that lacks it. Defaults to river.QueueDefault.
	MaintenanceQueue string

	// Logger receives transitions worth an operator's attention (fenced commits, takeovers,
	// undecodable cursors). Defaults to slog.Default(). Records logged inside a traced
	// attempt or step carry its trace_id and span_id.
	Logger *slog.Logger

	// TracerProvider gives the tracer of the Engine's spans: a run's start, each attempt,
	// its claim, each step and each takeover by maintenance (docs/design.md, *Tracing*).
	// Nil means otel.GetTracerProvider(), the global provider, a no-op until the
	// application installs one; Stepwise never configures an exporter itself.
	TracerProvider trace.TracerProvider
}

// ConfigWithDefaults returns a copy of c with zero fields set to their defaults. It is a
// function, not a method of Config, because users see Config through stepwise.Config, whose
// WithDefaults fills it (as river.Config.WithDefaults fills River's).
func ConfigWithDefaults(c *Config) *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Lease == 0 {
		out.Lease = LeaseDefault
	}
	if out.Heartbeat == 0 {
		out.Heartbeat = out.Lease / 3
	}
	if out.Slice == 0 {
		out.Slice = SliceDefault
	}
	if out.StallTimeout == 0 {
		out.StallTimeout = out.Lease
	}
	if out.LockTimeout == 0 {
		out.LockTimeout = LockTimeoutDefault
	}
	if out.MaintenanceInterval == 0 {
		out.MaintenanceInterval = MaintenanceIntervalDefault
	}
	if out.MaintenanceQueue == "" {
		out.MaintenanceQueue = river.QueueDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

func (c *Config) validate() error {
	switch {
	case c.Lease <= 0:
		return fmt.Errorf("workflow.Config.Lease is %s; it must be positive (0 means LeaseDefault, %s)", c.Lease, LeaseDefault)
	case c.Heartbeat <= 0 || c.Heartbeat >= c.Lease:
		return fmt.Errorf("workflow.Config.Heartbeat is %s; it must be positive and shorter than Lease (%s), e.g. Lease/3", c.Heartbeat, c.Lease)
	case c.Slice <= 0:
		return fmt.Errorf("workflow.Config.Slice is %s; it must be positive (0 means the default, %s)", c.Slice, SliceDefault)
	case c.StallTimeout <= 0:
		return fmt.Errorf("workflow.Config.StallTimeout is %s; it must be positive (0 means Lease)", c.StallTimeout)
	case c.MaintenanceInterval <= 0:
		return fmt.Errorf("workflow.Config.MaintenanceInterval is %s; it must be positive", c.MaintenanceInterval)
	}
	return nil
}

// Engine runs step functions as River workers. Create one per pool with New, add step workers
// with AddWorker, call Install on the river.Config before river.NewClient, run
// RunMaintenance in every process, and register Metrics (see the package doc's Wiring).
type Engine struct {
	pool   *pgxpool.Pool
	cfg    *Config
	store  *checkpoint.Store
	logger *slog.Logger
	tracer trace.Tracer

	mu         sync.Mutex
	registered map[*river.Workers]bool
	// slices are the Slice of each registered step worker, by kind, which Install checks
	// against River's RescueStuckJobsAfter; rescueAfter is the shortest such value of the
	// configs Install saw (0 before Install), which AddWorker checks later workers against.
	slices      map[string]time.Duration
	rescueAfter time.Duration
	metrics     *engineMetrics
	// retryPolicies are the river.Config.RetryPolicy of each config Install saw, by its
	// Workers bundle (nil: River's default). A step worker's back-off asks the policy of the
	// bundle it was added to, about the run's failures in a row (stepWorker.retryAt).
	retryPolicies map[*river.Workers]river.ClientRetryPolicy

	// fence is the step protocol's fencing: the token check at begin, the fenced write and
	// whether a lost lease stops the step. Always the checkpoint store, except that the fault
	// suite injects a deliberately broken one (export_test.go) to prove it catches a build
	// without the fence.
	fence stepFence

	// Where maintenance's paged scans resume: the sweep of unfinished runs for ended jobs
	// (a run key), and the scan of River's running jobs without a lease (a job id).
	sweepMu      sync.Mutex
	sweepAfter   string
	runningAfter int64
	waitAfter    string // the page of open waits checked for a lost wake (a run key)

	// draining is set by Quiesce: attempts release their run at the next step boundary.
	draining atomic.Bool

	// fencedCommit is whether the database has stepwise_fenced (migration 017), which the
	// one-round-trip commit needs: 0 not yet asked, 1 yes, -1 no (see pipelineCommit).
	fencedCommit atomic.Int32
}

// stepFence is the seam for the step protocol's fencing.
type stepFence interface {
	Begin(ctx context.Context, l *checkpoint.Lease) (pgx.Tx, error)
	Advance(ctx context.Context, tx pgx.Tx, l *checkpoint.Lease, cursor json.RawMessage, opts *checkpoint.AdvanceOpts) error
	// AdvanceCommit is Advance and the COMMIT of tx in one round trip.
	AdvanceCommit(ctx context.Context, tx pgx.Tx, l *checkpoint.Lease, cursor json.RawMessage, opts *checkpoint.AdvanceOpts) error
	// Enforced is false only for the fault suite's broken build: a lost lease goes unnoticed.
	Enforced() bool
}

// storeFence is the real fence: the checkpoint store's token check and fenced write.
type storeFence struct{ *checkpoint.Store }

func (storeFence) Enforced() bool { return true }

// New returns an Engine for step functions whose checkpoints live in pool's database.
func New(pool *pgxpool.Pool, cfg *Config) (*Engine, error) {
	if pool == nil {
		return nil, errors.New("workflow.New: pool is nil; pass the *pgxpool.Pool your River client uses")
	}
	cfg = ConfigWithDefaults(cfg)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := checkpoint.New(pool, &checkpoint.Config{
		Lease:        cfg.Lease,
		LockTimeout:  cfg.LockTimeout,
		StallTimeout: cfg.StallTimeout,
	})
	if err != nil {
		return nil, err
	}
	e := &Engine{pool: pool, cfg: cfg, store: store, logger: tracing.Logger(cfg.Logger), tracer: tracing.Tracer(cfg.TracerProvider), registered: map[*river.Workers]bool{}, slices: map[string]time.Duration{},
		retryPolicies: map[*river.Workers]river.ClientRetryPolicy{}, fence: storeFence{store}}
	e.metrics = newEngineMetrics(e)
	return e, nil
}

// Config returns the Engine's configuration with defaults applied.
func (e *Engine) Config() Config { return *e.cfg }

// Checkpoints returns the checkpoint store the Engine uses.
func (e *Engine) Checkpoints() *checkpoint.Store { return e.store }

// periodicJobs returns the Engine's maintenance job, which Install adds to
// river.Config.PeriodicJobs. River runs periodic jobs on its elected leader only.
func (e *Engine) periodicJobs() []*river.PeriodicJob {
	return []*river.PeriodicJob{
		river.NewPeriodicJob(
			river.PeriodicInterval(e.cfg.MaintenanceInterval),
			func() (river.JobArgs, *river.InsertOpts) { return maintenanceArgs{}, e.maintenanceInsertOpts() },
			&river.PeriodicJobOpts{ID: "stepwise_maintenance", RunOnStart: true},
		),
	}
}

// maintenanceInsertOpts makes the maintenance job unique among waiting and running jobs of
// the same period. Completed jobs are left out of ByState (River's default includes them):
// otherwise the first completed pass would block every later insert until River's cleaner
// removed its row, a day later, and takeover would silently stop. ByPeriod for the same
// reason with a job that stays 'running' because the process working it was killed
// (measured by stepwise-lab bench: the leader killed mid-pass left its job running,
// every later insert was a duplicate of it, and no run was taken over until River's rescue
// an hour later).
func (e *Engine) maintenanceInsertOpts() *river.InsertOpts {
	return &river.InsertOpts{Queue: e.cfg.MaintenanceQueue, UniqueOpts: river.UniqueOpts{
		ByArgs:   true,
		ByPeriod: max(e.cfg.MaintenanceInterval, time.Second), // River's minimum period
		ByState: []rivertype.JobState{
			rivertype.JobStateAvailable, rivertype.JobStatePending,
			rivertype.JobStateRunning, rivertype.JobStateRetryable, rivertype.JobStateScheduled,
		},
	}}
}

// Install wires the Engine into a River client config, before river.NewClient: it adds the
// maintenance worker, the maintenance periodic job, the maintenance queue (if the config
// has no queue of that name), and a worker middleware (in Plugins) by which step workers
// added without an Engine (stepwise.AddWorker) find this one. Without the maintenance job running somewhere, a run whose
// worker died waits for River's one-hour rescue instead of about a lease.
//
// Install records the config's RetryPolicy (set it before calling Install): a step error's
// back-off asks that policy (River's default when nil), about a copy of the job whose Attempt
// and Errors count the run's failures in a row rather than the job's errors ever, so a long
// run that recovers between hiccups keeps short back-offs (docs/design.md, *The failure
// budget*).
//
// Install also checks Config.Slice, and the Slice of every step worker added so far, against
// the config's RescueStuckJobsAfter (River's default when zero: an hour, or JobTimeout plus
// an hour), which River's rescuer uses: an attempt that runs longer would be rescued as stuck
// while healthy. Step workers added after Install are checked by AddWorker.
func (e *Engine) Install(rc *river.Config) error {
	if rc == nil {
		return errors.New("stepwise.NewClient: Config.River is nil")
	}
	if rc.Schema != "" {
		// Maintenance and resumes read river_job unqualified, through the pool's search_path;
		// with River's tables in another schema they would silently read the wrong table.
		return fmt.Errorf("stepwise.NewClient: Config.River.Schema is %q, but Stepwise reads River's tables through the connection's search_path; leave Schema empty and put %q first in the pool's search_path (e.g. the connection string's search_path=%s) instead", rc.Schema, rc.Schema, rc.Schema)
	}
	rescue := riverRescueAfter(rc)
	e.mu.Lock()
	if err := checkSlice("workflow.Config.Slice", e.cfg.Slice, rescue); err != nil {
		e.mu.Unlock()
		return err
	}
	for kind, slice := range e.slices {
		if err := checkSlice(fmt.Sprintf("StepOptions.Slice of %s", kind), slice, rescue); err != nil {
			e.mu.Unlock()
			return err
		}
	}
	if e.rescueAfter == 0 || rescue < e.rescueAfter {
		e.rescueAfter = rescue
	}
	e.mu.Unlock()
	if rc.Workers == nil {
		rc.Workers = river.NewWorkers()
	}
	if err := checkUnboundSlices(rc.Workers, rescue); err != nil {
		return err
	}
	e.installMiddleware(rc)
	e.mu.Lock()
	e.retryPolicies[rc.Workers] = rc.RetryPolicy
	e.mu.Unlock()
	if err := e.addMaintenanceWorker(rc.Workers); err != nil {
		return err
	}
	rc.PeriodicJobs = append(rc.PeriodicJobs, e.periodicJobs()...)
	if rc.Queues == nil {
		rc.Queues = map[string]river.QueueConfig{}
	}
	if _, ok := rc.Queues[e.cfg.MaintenanceQueue]; !ok {
		rc.Queues[e.cfg.MaintenanceQueue] = river.QueueConfig{MaxWorkers: 1}
	}
	return nil
}

// riverRescueAfter is the RescueStuckJobsAfter River's client will use for rc, computed as
// river.NewClient computes it.
func riverRescueAfter(rc *river.Config) time.Duration {
	if rc.RescueStuckJobsAfter > 0 {
		return rc.RescueStuckJobsAfter
	}
	if rc.JobTimeout > 0 {
		return rc.JobTimeout + RiverRescueStuckJobsAfterDefault
	}
	return RiverRescueStuckJobsAfterDefault
}

// checkSlice refuses a slice that River's rescuer would cut short.
func checkSlice(what string, slice, rescue time.Duration) error {
	if slice < rescue {
		return nil
	}
	return fmt.Errorf("workflow: %s (%s) must be shorter than the river.Config's RescueStuckJobsAfter (%s), or River would rescue healthy runs as stuck; shorten the slice (e.g. %s) or set river.Config.RescueStuckJobsAfter above %s",
		what, slice, rescue, rescue/2, slice)
}

// retryPolicy is the RetryPolicy of the river.Config whose Workers bundle is workers (nil:
// River's default); known is false when Install never saw that config.
func (e *Engine) retryPolicy(workers *river.Workers) (policy river.ClientRetryPolicy, known bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	policy, known = e.retryPolicies[workers]
	return policy, known
}

func (e *Engine) addMaintenanceWorker(workers *river.Workers) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.registered[workers] {
		return nil
	}
	if err := river.AddWorkerSafely[maintenanceArgs](workers, &maintenanceWorker{e: e}); err != nil {
		return err
	}
	e.registered[workers] = true
	return nil
}

// AddWorker registers w with River's workers as the worker for A's kind. It panics on bad
// wiring (a kind registered twice), like river.AddWorker.
//
// With a nil Engine, w works with the Engine installed in the River client that fetches its
// job (Install adds a worker middleware that tells it), which is what stepwise.AddWorker does:
// one Workers bundle can then serve several clients, and a job worked by a River client
// without an Engine fails with ErrNoEngine, naming the fix.
func AddWorker[A river.JobArgs, C any](e *Engine, workers *river.Workers, w Stepper[A, C]) {
	if err := AddWorkerSafely(e, workers, w); err != nil {
		panic(err)
	}
}

// AddWorkerSafely is AddWorker returning an error instead of panicking.
func AddWorkerSafely[A river.JobArgs, C any](e *Engine, workers *river.Workers, w Stepper[A, C]) error {
	if workers == nil {
		return errors.New("stepwise.AddWorker: workers is nil; pass the river.NewWorkers() bundle your client uses")
	}
	if w == nil {
		return errors.New("stepwise.AddWorker: worker is nil")
	}
	if e == nil {
		return addUnbound(workers, w)
	}
	var a A
	if err := checkCursorVersioning(w); err != nil {
		return err
	}
	slice := e.cfg.Slice
	if o := w.StepOptions(); o != nil && o.Slice != 0 {
		if o.Slice < 0 {
			return fmt.Errorf("stepwise.AddWorker(%s): StepOptions.Slice is %s; it must be positive (0 means Config.Slice)", a.Kind(), o.Slice)
		}
		slice = o.Slice
	}
	e.mu.Lock()
	rescue := e.rescueAfter
	e.mu.Unlock()
	if rescue > 0 {
		if err := checkSlice(fmt.Sprintf("StepOptions.Slice of %s", a.Kind()), slice, rescue); err != nil {
			return err
		}
	}
	if err := river.AddWorkerSafely[A](workers, &stepWorker[A, C]{e: e, w: w, slice: slice, workers: workers}); err != nil {
		return err
	}
	e.mu.Lock()
	e.slices[a.Kind()] = slice
	e.mu.Unlock()
	return e.addMaintenanceWorker(workers)
}
