package stepwise

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

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
	// own. Schema must be empty (see workflow.Engine.Install).
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

	// Outbox tunes the dispatchers (PollInterval, Slice, DispatcherLease, ID). Its Kinds
	// must be empty: kinds are configured in Config.Kinds. Nil means outbox's defaults.
	Outbox *outbox.Config

	// Reconcile tunes the reconciler (Interval, Slice, Actor). Its Outbox and Kinds must be
	// empty: the Client sets them from Config.Kinds. Nil means reconcile's defaults.
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

// Schedule is a schedule the Client registers with its scheduler: a schedule.Schedule[A].
type Schedule interface {
	AddTo(s *schedule.Scheduler) error
}

// KindConfig configures one kind of external operation: how it is sent (the outbox), how an
// operation whose outcome is unknown is looked up (the reconciler), and what business state
// moves with each outcome. The limits map onto outbox.KindConfig and reconcile.KindConfig,
// whose documentation gives their defaults and how to size them.
type KindConfig struct {
	// Sender performs the operations (outbox.KindConfig.Sender). Required.
	Sender outbox.Sender

	// Checker looks an operation up by its id when its outcome is unknown
	// (reconcile.KindConfig.Checker). Without one in any process, an UNKNOWN_EXTERNAL
	// operation of the kind waits forever: Start warns, and the gauge
	// stepwise_client_kind_without_checker says so.
	Checker reconcile.Checker

	// Statement lists what the external system applied, for reconcile.CompareTotals.
	// Optional.
	Statement reconcile.Statement

	// OnOutcome or OnOutcomeBatch moves business state with each recorded transition, in its
	// transaction (outbox.KindConfig). Optional; at most one.
	OnOutcome      outbox.OutcomeFunc
	OnOutcomeBatch outbox.OutcomeBatchFunc

	// Sending: outbox.KindConfig's Concurrency, RatePerSecond, Timeout, Lease, BatchSize,
	// RetryBackoff and MaxAttempts. Zero means outbox's default.
	Concurrency   int
	RatePerSecond float64
	Timeout       time.Duration
	Lease         time.Duration
	BatchSize     int
	RetryBackoff  func(attempt int) time.Duration
	MaxAttempts   int

	// Reconciling: reconcile.KindConfig's Concurrency, RatePerSecond, Timeout, BatchSize,
	// Grace, GiveUpAfter, MaxChecks and CheckBackoff. Zero means reconcile's default.
	CheckConcurrency   int
	CheckRatePerSecond float64
	CheckTimeout       time.Duration
	CheckBatchSize     int
	Grace              time.Duration
	GiveUpAfter        time.Duration
	MaxChecks          int
	CheckBackoff       func(check int) time.Duration
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
	out.Workflow = wf.WithDefaults()

	ob := copyOf(out.Outbox)
	if ob.Logger == nil {
		ob.Logger = out.Logger
	}
	if ob.TracerProvider == nil {
		ob.TracerProvider = out.TracerProvider
	}
	out.Outbox = ob.WithDefaults()

	rec := copyOf(out.Reconcile)
	if rec.Logger == nil {
		rec.Logger = out.Logger
	}
	if rec.TracerProvider == nil {
		rec.TracerProvider = out.TracerProvider
	}
	out.Reconcile = rec.WithDefaults()

	sch := copyOf(out.Scheduler)
	if sch.Logger == nil {
		sch.Logger = out.Logger
	}
	out.Scheduler = sch.WithDefaults()

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
	if len(c.Outbox.Kinds) > 0 {
		return errors.New("stepwise: Config.Outbox.Kinds is set; configure kinds in Config.Kinds (one map for sending and reconciling)")
	}
	if c.Reconcile.Outbox != nil || len(c.Reconcile.Kinds) > 0 {
		return errors.New("stepwise: Config.Reconcile.Outbox or .Kinds is set; the Client sets them: configure kinds in Config.Kinds")
	}
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
	return nil
}

// outboxConfig is the outbox's config: Config.Outbox's tunables with the kinds of Config.Kinds.
func (c *Config) outboxConfig() *outbox.Config {
	out := *c.Outbox
	out.Kinds = make(map[string]*outbox.KindConfig, len(c.Kinds))
	for name, k := range c.Kinds {
		out.Kinds[name] = &outbox.KindConfig{
			Sender: k.Sender, OnOutcome: k.OnOutcome, OnOutcomeBatch: k.OnOutcomeBatch,
			Concurrency: k.Concurrency, RatePerSecond: k.RatePerSecond, Timeout: k.Timeout, Lease: k.Lease,
			BatchSize: k.BatchSize, RetryBackoff: k.RetryBackoff, MaxAttempts: k.MaxAttempts,
		}
	}
	return &out
}

// reconcileConfig is the reconciler's config for the kinds that have a Checker, or nil when
// none has.
func (c *Config) reconcileConfig(ob *outbox.Outbox) *reconcile.Config {
	out := *c.Reconcile
	out.Outbox = ob
	out.Kinds = map[string]*reconcile.KindConfig{}
	for name, k := range c.Kinds {
		if k.Checker == nil {
			continue
		}
		out.Kinds[name] = &reconcile.KindConfig{
			Checker: k.Checker, Concurrency: k.CheckConcurrency, RatePerSecond: k.CheckRatePerSecond,
			Timeout: k.CheckTimeout, BatchSize: k.CheckBatchSize, Grace: k.Grace, GiveUpAfter: k.GiveUpAfter,
			MaxChecks: k.MaxChecks, CheckBackoff: k.CheckBackoff,
		}
	}
	if len(out.Kinds) == 0 {
		return nil
	}
	return &out
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
