package stepwise

import (
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	ioutbox "github.com/stepwise-go/stepwise/internal/outbox"
	ireconcile "github.com/stepwise-go/stepwise/internal/reconcile"
	schedengine "github.com/stepwise-go/stepwise/internal/schedule"
	iworkflow "github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflow"
)

// StopTimeoutDefault is Config.StopTimeout when it is zero.
const StopTimeoutDefault = 30 * time.Second

// Config configures a Client. Only River and Kinds matter to most programs; every other
// field has a default (see WithDefaults).
type Config struct {
	// River is the config of the River client the Client builds: your own queues, workers,
	// periodic jobs, middleware, retry policy. NewClient works on a copy (its Queues,
	// PeriodicJobs and Plugins are copied before Stepwise adds its own), except for
	// Workers: the bundle is River's, opaque, and receives Stepwise's workers — give each
	// Client its own river.NewWorkers() bundle. Nil means a config with no queue of your
	// own. Schema must be empty: Stepwise reads River's tables
	// through the connection's search_path; put River's schema there instead.
	River *river.Config

	// Kinds configures each kind of external operation (outbox.Enqueue's Kind) this process
	// delivers and reconciles, in one place. Optional: a program without external operations
	// leaves it empty.
	Kinds map[string]*KindConfig

	// Schedules are the cron schedules whose slots this process starts runs for (a
	// schedule.Schedule[A] value each). With none, the Client has no scheduler.
	Schedules []Schedule

	// Workflow tunes the step engine (lease, heartbeat, slice, maintenance interval). Nil
	// means workflow's defaults.
	Workflow *workflow.Config

	// Outbox tunes the dispatchers (PollInterval, Slice, DispatcherLease, ID); the kinds are
	// configured in Config.Kinds. Nil means outbox's defaults.
	Outbox *outbox.Config

	// Reconcile tunes the reconciler (Interval, Slice, Actor); the kinds are configured in
	// Config.Kinds. Nil means reconcile's defaults.
	Reconcile *reconcile.Config

	// Scheduler tunes the scheduler (TickInterval, MaxSlotsPerTick). Nil means schedule's
	// defaults.
	Scheduler *schedule.Config

	// StopTimeout bounds Stop's drain: past it (or past the deadline of Stop's context, if
	// sooner), the steps and sends still in flight are cancelled (River's StopAndCancel).
	// Keep it above the longest send Timeout and below your orchestrator's kill deadline.
	//
	// Defaults to StopTimeoutDefault (30s).
	StopTimeout time.Duration

	// Logger receives the Client's warnings (a tight pool, a kind nobody reconciles, failed
	// maintenance passes) and is the default Logger of the engine, outbox, reconciler and
	// scheduler. Defaults to slog.Default().
	Logger *slog.Logger

	// TracerProvider is the default TracerProvider of the engine, outbox and reconciler. Nil
	// means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Schedule is a schedule the Client registers with its scheduler: a schedule.Schedule[A],
// whatever its A, so that one list holds schedules of different argument types. AddTo takes
// the internal scheduler, so no other type can implement it.
type Schedule interface {
	AddTo(s *schedengine.Scheduler) error
}

// KindConfig configures one kind of external operation: how it is sent (the outbox), how an
// operation whose outcome is unknown is looked up (the reconciler), and what business state
// moves with each outcome. Every zero limit takes its default (outbox.…Default for sending,
// reconcile.…Default for reconciling); a negative one (but MaxAttempts -1) is refused by
// NewClient, with the field's name. The Check… limits, Grace, GiveUpAfter and MaxChecks apply
// (and are checked) only for a kind with a Checker.
type KindConfig struct {
	// Sender performs the operations, under op.IdempotencyKey(). Required.
	Sender outbox.Sender

	// Checker looks an operation up by its id when its outcome is unknown. Without one in
	// any process, an UNKNOWN_EXTERNAL operation of the kind waits forever: Start warns, and
	// the gauge stepwise_client_kind_without_checker says so.
	Checker reconcile.Checker

	// Statement lists what the external system applied, for reconcile.CompareTotals and the
	// console's totals. Optional.
	Statement reconcile.Statement

	// OnOutcome is called in the transaction of each recorded transition out of PROCESSING,
	// UNKNOWN_EXTERNAL and MANUAL, so that business state moves with the ledger; OnOutcomeBatch
	// once per recorded batch, in its transaction. If it returns an error the transition is
	// not recorded. Optional; at most one of the two.
	OnOutcome      outbox.OutcomeFunc
	OnOutcomeBatch outbox.OutcomeBatchFunc

	// Concurrency is how many Send calls of this kind run at once in one process: the knob of
	// delivery's throughput against a real external system, since one process delivers at
	// most Concurrency / latency operations per second (16 sends at once to a bank answering
	// in 200ms: 80/s; 256: 1,280/s). Size it as target rate × the external system's typical
	// latency, within what that system allows (RatePerSecond). Senders hold no database
	// connection: size the pool by River's workers, not by this. Give the Sender's HTTP
	// client as many idle connections per host (http.Transport.MaxIdleConnsPerHost) as
	// Concurrency, or each send beyond them opens and closes a connection. See the
	// performance budget in docs/design.md for where more stops helping.
	//
	// Defaults to outbox.ConcurrencyDefault (16): polite to an external system nobody has
	// sized yet, and enough for 80-320 operations/s at 50-200ms. At most 10,000.
	Concurrency int

	// RatePerSecond caps Send calls per second for this kind in one process, so that a burst
	// does not trip the external system's own rate limit. Defaults to 0: no limit.
	RatePerSecond float64

	// Timeout bounds each Send call. A send that times out is UNKNOWN_EXTERNAL, not failed.
	//
	// Defaults to outbox.TimeoutDefault (30s).
	Timeout time.Duration

	// Lease is how long a claim protects an operation in PROCESSING without being renewed:
	// how long after a crash (kill -9, a frozen VM, a lost network) the dispatcher's
	// operations are declared UNKNOWN_EXTERNAL, for the reconciler, never resent blindly. No
	// Send starts unless the claim is certainly valid for at least Timeout, so Lease must be
	// longer than Timeout (NewClient refuses otherwise); twice Timeout or more keeps renewals
	// off the sending path.
	//
	// Defaults to outbox.LeaseDefault (1m). At least 1s.
	Lease time.Duration

	// BatchSize is how many due operations a dispatcher claims with one statement, and at
	// most how many outcomes it records in one transaction. Claiming, sending and recording
	// overlap, so it need not grow with Concurrency.
	//
	// Defaults to outbox.BatchSizeDefault (200). At most 10,000.
	BatchSize int

	// RetryBackoff is the wait before the attempt-th resend of a RETRYABLE operation.
	//
	// Defaults to outbox.DefaultRetryBackoff: 1s doubling to 10m, with jitter.
	RetryBackoff func(attempt int) time.Duration

	// MaxAttempts is how many times an operation is sent (all RETRYABLE) before it is moved
	// to MANUAL with the reason, for a person to decide.
	//
	// Defaults to outbox.MaxAttemptsDefault (25). -1 retries forever.
	MaxAttempts int

	// CheckConcurrency is how many lookups run at once in one process: at most
	// CheckConcurrency / latency lookups per second (8 at a bank answering in 100ms: 80/s, so
	// the 20,000 payouts a bank incident leaves unknown on a million-payout day take four
	// minutes; 256: nine seconds). Size it by the backlog you must clear after an incident
	// and what the external system allows (CheckRatePerSecond).
	//
	// Defaults to reconcile.ConcurrencyDefault (8). At most 10,000.
	CheckConcurrency int

	// CheckRatePerSecond caps lookups per second in one process, so that reconciling a
	// backlog after an outage does not hammer the system that just came back. Defaults to 0:
	// no limit.
	CheckRatePerSecond float64

	// CheckTimeout bounds each lookup; one that times out is checked again later.
	//
	// Defaults to reconcile.TimeoutDefault (10s).
	CheckTimeout time.Duration

	// CheckBatchSize is how many due operations one reconciler claim takes, and the most
	// decisions one recording transaction holds (not how many lookups are in flight: that is
	// CheckConcurrency).
	//
	// Defaults to 4 × CheckConcurrency, at least reconcile.BatchSizeDefault (100) and at
	// most 10,000; a value set above 10,000 is refused.
	CheckBatchSize int

	// Grace is how long after an operation's last request could still be in flight a
	// LookupNotFound is believed: before that the request may land after the lookup, so the
	// reconciler waits instead of resending. It must exceed Timeout (NewClient refuses
	// otherwise).
	//
	// Defaults to reconcile.GraceDefault (5m).
	Grace time.Duration

	// GiveUpAfter is how long an operation may stay UNKNOWN_EXTERNAL before the reconciler
	// stops asking and moves it to MANUAL, with the reason. A definitive answer found on the
	// last check is still applied.
	//
	// Defaults to reconcile.GiveUpAfterDefault (72h).
	GiveUpAfter time.Duration

	// MaxChecks is how many lookups an operation gets in one UNKNOWN_EXTERNAL episode before
	// it moves to MANUAL, with the reason.
	//
	// Defaults to reconcile.MaxChecksDefault (100).
	MaxChecks int

	// CheckBackoff is the wait before the next lookup after the check-th one was pending or
	// failed.
	//
	// Defaults to reconcile.DefaultCheckBackoff: 5s doubling to 1h, with jitter.
	CheckBackoff func(check int) time.Duration
}

// WithDefaults returns a copy of the config with every unset field at its default, the
// components' configs included (as river.Config.WithDefaults does). River is copied as
// NewClient copies it; Kinds are copied.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.StopTimeout == 0 {
		out.StopTimeout = StopTimeoutDefault
	}
	out.River = copyRiverConfig(out.River)

	wf := copyOf(out.Workflow)
	if wf.Logger == nil {
		wf.Logger = out.Logger
	}
	if wf.TracerProvider == nil {
		wf.TracerProvider = out.TracerProvider
	}
	out.Workflow = iworkflow.ConfigWithDefaults(wf)

	ob := copyOf(out.Outbox)
	if ob.Logger == nil {
		ob.Logger = out.Logger
	}
	if ob.TracerProvider == nil {
		ob.TracerProvider = out.TracerProvider
	}
	d := outboxTunables(ob).WithDefaults()
	out.Outbox = &outbox.Config{ID: d.ID, Logger: d.Logger, TracerProvider: d.TracerProvider,
		PollInterval: d.PollInterval, Slice: d.Slice, DispatcherLease: d.DispatcherLease}

	rec := copyOf(out.Reconcile)
	if rec.Logger == nil {
		rec.Logger = out.Logger
	}
	if rec.TracerProvider == nil {
		rec.TracerProvider = out.TracerProvider
	}
	r := reconcileTunables(rec).WithDefaults()
	out.Reconcile = &reconcile.Config{Actor: r.Actor, Interval: r.Interval, Slice: r.Slice,
		Logger: r.Logger, TracerProvider: r.TracerProvider}

	sch := copyOf(out.Scheduler)
	if sch.Logger == nil {
		sch.Logger = out.Logger
	}
	out.Scheduler = schedengine.ConfigWithDefaults(sch)

	kinds := make(map[string]*KindConfig, len(out.Kinds))
	for name, k := range out.Kinds {
		if k == nil {
			kinds[name] = nil
			continue
		}
		kc := *k
		kinds[name] = &kc
	}
	out.Kinds = kinds
	out.Schedules = append([]Schedule(nil), out.Schedules...)
	return &out
}

func copyOf[T any](p *T) *T {
	var out T
	if p != nil {
		out = *p
	}
	return &out
}

// copyRiverConfig copies rc and the lists Stepwise appends to, so that installing Stepwise
// leaves the caller's config as it was (but for the Workers bundle, which cannot be copied).
func copyRiverConfig(rc *river.Config) *river.Config {
	out := copyOf(rc)
	queues := make(map[string]river.QueueConfig, len(out.Queues))
	for name, qc := range out.Queues {
		queues[name] = qc
	}
	out.Queues = queues
	out.PeriodicJobs = append([]*river.PeriodicJob(nil), out.PeriodicJobs...)
	if out.Plugins != nil {
		out.Plugins = append(out.Plugins[:0:0], out.Plugins...)
	}
	if out.Workers == nil {
		out.Workers = river.NewWorkers()
	}
	return out
}

// kindNames returns the configured kinds, sorted.
func (c *Config) kindNames() []string {
	names := make([]string, 0, len(c.Kinds))
	for name := range c.Kinds {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func (c *Config) validate() error {
	if c.StopTimeout < 0 {
		return fmt.Errorf("stepwise: Config.StopTimeout is %s; it must be positive (0 means %s)", c.StopTimeout, StopTimeoutDefault)
	}
	for _, name := range c.kindNames() {
		k := c.Kinds[name]
		if k == nil {
			return fmt.Errorf("stepwise: Config.Kinds[%q] is nil; give it a KindConfig with a Sender", name)
		}
		if k.Sender == nil {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Sender is nil; every kind needs a Sender (the reconciler resends through it)", name)
		}
	}
	for i, s := range c.Schedules {
		if s == nil {
			return fmt.Errorf("stepwise: Config.Schedules[%d] is nil; give it a schedule.Schedule[A] value", i)
		}
	}
	// The scheduler is built only when there are schedules; its config is checked either
	// way, or a wrong value would be found only on the deploy that adds the first schedule.
	if err := schedengine.CheckConfig(c.Scheduler); err != nil {
		return fmt.Errorf("stepwise: %w", err)
	}
	return nil
}

// outboxTunables is the internal outbox config holding o's fields, without kinds: the one
// place a field added to outbox.Config is carried over.
func outboxTunables(o *outbox.Config) *ioutbox.Config {
	return &ioutbox.Config{ID: o.ID, Logger: o.Logger, TracerProvider: o.TracerProvider, PollInterval: o.PollInterval,
		Slice: o.Slice, DispatcherLease: o.DispatcherLease}
}

// reconcileTunables is the internal reconciler config holding r's fields, without kinds.
func reconcileTunables(r *reconcile.Config) *ireconcile.Config {
	return &ireconcile.Config{Actor: r.Actor, Interval: r.Interval, Slice: r.Slice, Logger: r.Logger, TracerProvider: r.TracerProvider}
}

// outboxConfig is the outbox's config: Config.Outbox's tunables with the kinds of Config.Kinds.
func (c *Config) outboxConfig() *ioutbox.Config {
	out := outboxTunables(c.Outbox)
	out.Kinds = make(map[string]*ioutbox.KindConfig, len(c.Kinds))
	for name, k := range c.Kinds {
		out.Kinds[name] = &ioutbox.KindConfig{
			Sender: k.Sender, OnOutcome: k.OnOutcome, OnOutcomeBatch: k.OnOutcomeBatch,
			Concurrency: k.Concurrency, RatePerSecond: k.RatePerSecond, Timeout: k.Timeout, Lease: k.Lease,
			BatchSize: k.BatchSize, RetryBackoff: k.RetryBackoff, MaxAttempts: k.MaxAttempts,
		}
	}
	return out
}

// reconcileConfig is the reconciler's config for the kinds that have a Checker, or nil when
// none has.
func (c *Config) reconcileConfig(ob *ioutbox.Outbox) *ireconcile.Config {
	out := reconcileTunables(c.Reconcile)
	out.Outbox, out.Kinds = ob, map[string]*ireconcile.KindConfig{}
	for name, k := range c.Kinds {
		if k.Checker == nil {
			continue
		}
		out.Kinds[name] = &ireconcile.KindConfig{
			Checker: k.Checker, Concurrency: k.CheckConcurrency, RatePerSecond: k.CheckRatePerSecond,
			Timeout: k.CheckTimeout, BatchSize: k.CheckBatchSize, Grace: k.Grace, GiveUpAfter: k.GiveUpAfter,
			MaxChecks: k.MaxChecks, CheckBackoff: k.CheckBackoff,
		}
	}
	if len(out.Kinds) == 0 {
		return nil
	}
	return out
}

// kindsWithoutChecker are the kinds with a Sender and no Checker in this config.
func (c *Config) kindsWithoutChecker() []string {
	var out []string
	for _, name := range c.kindNames() {
		if c.Kinds[name].Checker == nil {
			out = append(out, name)
		}
	}
	return out
}
