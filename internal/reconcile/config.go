package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/jitter"
	"github.com/stepwise-go/stepwise/internal/outbox"
)

// LookupStatus is what the external system says about an operation_id.
type LookupStatus string

const (
	// LookupFoundSucceeded: the external system applied the operation. LookupResult carries its
	// reference, amount and currency.
	LookupFoundSucceeded LookupStatus = "found_succeeded"
	// LookupFoundFailed: the external system holds the operation as definitely failed (declined).
	LookupFoundFailed LookupStatus = "found_failed"
	// LookupPending: the external system has it and has not decided yet.
	LookupPending LookupStatus = "pending"
	// LookupNotFound: the external system has no operation under this id, yet. A request still in
	// flight may land later; the reconciler waits out the grace period before resending.
	LookupNotFound LookupStatus = "not_found"
)

// LookupResult is the answer of a Checker.
type LookupResult struct {
	Status LookupStatus
	// ExternalRef is the external system's reference for a found operation.
	ExternalRef string
	// Amount (minor units) and Currency are what the external system holds for a
	// LookupFoundSucceeded operation. When the operation carries a currency, they must match the
	// ledger's, or the operation goes to MANUAL with reason "mismatch".
	Amount   int64
	Currency string
	// Reason is the external system's reason for LookupFoundFailed (a decline reason).
	Reason string
}

// Checker asks the external system of one kind what became of an operation, by its
// operation_id (op.IdempotencyKey()). Return an error only when the question itself failed
// (a timeout, a 5xx): the reconciler then asks again later. "No such operation" is LookupNotFound,
// not an error.
type Checker interface {
	Lookup(ctx context.Context, op *outbox.Operation) (LookupResult, error)
}

// CheckerFunc adapts a function to Checker.
type CheckerFunc func(ctx context.Context, op *outbox.Operation) (LookupResult, error)

// Lookup calls f.
func (f CheckerFunc) Lookup(ctx context.Context, op *outbox.Operation) (LookupResult, error) {
	return f(ctx, op)
}

// KindConfig configures the reconciliation of one kind of operation.
type KindConfig struct {
	// Checker looks operations up. Required.
	Checker Checker

	// BatchSize is how many due operations one claim takes, and the most decisions one
	// recording transaction holds. A pass claims the next batch while the last is still being
	// looked up, and records decisions as they arrive, so BatchSize sets the statements per
	// lookup and how long a claim holds its operations (next_check_at is pushed past their
	// lookups), not how many lookups are in flight: that is Concurrency.
	//
	// Defaults to 4 × Concurrency, at least BatchSizeDefault (100) and at most 10,000.
	BatchSize int

	// Concurrency is how many lookups run at once in one process: at most Concurrency /
	// latency lookups per second (8 at a bank answering in 100ms: 80/s, so the 20,000
	// payouts a bank incident leaves unknown on a million-payout day take four minutes;
	// 256: 2,357/s of 2,560 on a quiet 2-core machine, nine seconds; the ledger's writes,
	// about 0.3 of the pass's time there, set the pace beyond). Size it by the backlog you
	// must clear after an incident and what the external system allows (RatePerSecond).
	//
	// Defaults to ConcurrencyDefault (8).
	Concurrency int

	// RatePerSecond caps lookups per second in one process, so that reconciling a backlog
	// after an outage does not hammer the external system that just came back.
	//
	// Defaults to 0: no limit.
	RatePerSecond float64

	// Timeout bounds each lookup. A lookup that times out counts as a lookup error: the
	// operation is checked again later.
	//
	// Defaults to TimeoutDefault (10s).
	Timeout time.Duration

	// Grace is how long after an operation was last sent a LookupNotFound is believed. Before
	// that, the request may still be in flight (queued in a load balancer, retried by a
	// proxy) and land after the lookup, so the reconciler waits instead of resending. It
	// must exceed the outbox kind's send Timeout.
	//
	// Defaults to GraceDefault (5m).
	Grace time.Duration

	// GiveUpAfter is how long an operation may stay UNKNOWN_EXTERNAL before the reconciler
	// stops asking and moves it to MANUAL, with the reason, for a person to decide. A
	// definitive answer found on the last check is still applied.
	//
	// Defaults to GiveUpAfterDefault (72h).
	GiveUpAfter time.Duration

	// MaxChecks is how many lookups an operation gets in one UNKNOWN_EXTERNAL episode before
	// it moves to MANUAL, with the reason.
	//
	// Defaults to MaxChecksDefault (100).
	MaxChecks int

	// CheckBackoff is the wait before the next lookup after the check-th one was pending or
	// failed.
	//
	// Defaults to DefaultCheckBackoff: 5s doubling to 1h, with jitter.
	CheckBackoff func(check int) time.Duration
}

// Config configures a Reconciler.
type Config struct {
	// Outbox is the ledger's Outbox. Its outcome callbacks run in the transaction of every
	// transition the reconciler records, as they do for the dispatcher's. Required.
	Outbox *outbox.Outbox

	// Kinds configures each kind to reconcile. Required; each kind must also be configured in
	// the Outbox (whose callback it needs).
	Kinds map[string]*KindConfig

	// Actor names the reconciler in audit events.
	//
	// Defaults to "reconcile".
	Actor string

	// Interval is how often River's leader runs a reconciliation pass (a periodic job), and
	// how often RunMaintenance runs one in every process that calls it.
	//
	// Defaults to 10s.
	Interval time.Duration

	// Slice is the longest one pass runs before it returns to River; the next pass goes on
	// where it stopped.
	//
	// Defaults to 1m.
	Slice time.Duration

	// Logger receives what cannot be returned: a transition whose outcome callback failed.
	//
	// Defaults to slog.Default(). Records logged inside a traced check carry its trace_id
	// and span_id.
	Logger *slog.Logger

	// TracerProvider gives the tracer of the "stepwise.check" span of each lookup, linked to
	// the span that enqueued the operation (docs/design.md, *Tracing*). Nil means
	// otel.GetTracerProvider(), a no-op until the application installs a provider;
	// Stepwise never configures an exporter itself.
	TracerProvider trace.TracerProvider
}

// Defaults of Config and KindConfig: the value an unset (zero) field takes.
const (
	ActorDefault       = "reconcile"      // Config.Actor
	IntervalDefault    = 10 * time.Second // Config.Interval
	SliceDefault       = time.Minute      // Config.Slice
	BatchSizeDefault   = 100              // KindConfig.BatchSize, at least (4 × Concurrency when that is more)
	ConcurrencyDefault = 8                // KindConfig.Concurrency
	TimeoutDefault     = 10 * time.Second // KindConfig.Timeout
	GraceDefault       = 5 * time.Minute  // KindConfig.Grace
	GiveUpAfterDefault = 72 * time.Hour   // KindConfig.GiveUpAfter
	MaxChecksDefault   = 100              // KindConfig.MaxChecks
)

const (
	// batchRoundsDefault is how many rounds of Concurrency lookups an unset BatchSize holds.
	batchRoundsDefault = 4
	// maxBatchSize bounds BatchSize: one claim statement and one recording transaction.
	maxBatchSize = 10000
)

// DefaultCheckBackoff waits 5s, 10s, 20s, ... up to an hour before the next lookup, each with
// ±25% jitter, so that a backlog of unknown operations spreads out instead of returning in
// one wave.
func DefaultCheckBackoff(check int) time.Duration {
	return jitter.Doubling(5*time.Second, time.Hour, check)
}

// WithDefaults returns a copy of the config with every unset field at its default.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Actor == "" {
		out.Actor = ActorDefault
	}
	if out.Interval == 0 {
		out.Interval = IntervalDefault
	}
	if out.Slice == 0 {
		out.Slice = SliceDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	kinds := make(map[string]*KindConfig, len(out.Kinds))
	for name, kc := range out.Kinds {
		if kc == nil {
			kinds[name] = nil
			continue
		}
		k := *kc
		if k.Concurrency == 0 {
			k.Concurrency = ConcurrencyDefault
		}
		if k.BatchSize == 0 {
			// Several rounds of Concurrency per claim: one claim statement serves many
			// lookups, and the next claim is made long before the workers run dry.
			k.BatchSize = min(max(BatchSizeDefault, batchRoundsDefault*k.Concurrency), maxBatchSize)
		}
		if k.Timeout == 0 {
			k.Timeout = TimeoutDefault
		}
		if k.Grace == 0 {
			k.Grace = GraceDefault
		}
		if k.GiveUpAfter == 0 {
			k.GiveUpAfter = GiveUpAfterDefault
		}
		if k.MaxChecks == 0 {
			k.MaxChecks = MaxChecksDefault
		}
		if k.CheckBackoff == nil {
			k.CheckBackoff = DefaultCheckBackoff
		}
		kinds[name] = &k
	}
	out.Kinds = kinds
	return &out
}

// validate names what is wrong as the user configured it (stepwise.Config.Kinds and
// stepwise.Config.Reconcile, from which the client builds this config), except for the
// Outbox and the kinds' presence there, which only the client sets.
func (c *Config) validate() error {
	if c.Outbox == nil {
		return errors.New("reconcile: Config.Outbox is nil; pass the *outbox.Outbox whose operations it settles (its outcome callbacks must run on every transition)")
	}
	if len(c.Kinds) == 0 {
		return errors.New("reconcile: Config.Kinds is empty; configure at least one kind with its Checker")
	}
	names := make([]string, 0, len(c.Kinds))
	for name := range c.Kinds {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		k := c.Kinds[name]
		if k == nil {
			return fmt.Errorf("stepwise: Config.Kinds[%q] is nil; give it a KindConfig with a Checker", name)
		}
		if k.Checker == nil {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Checker is nil; every kind needs a Checker", name)
		}
		ok := c.Outbox.KindConfig(name)
		if ok == nil {
			return fmt.Errorf("reconcile: Config.Kinds[%q]: the Outbox has no such kind; configure it there too (its outcome callback must run on every transition)", name)
		}
		if k.Grace <= ok.Timeout {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Grace %s is not longer than its send Timeout %s; "+
				"a request still in flight could land after a not-found lookup and the resend", name, k.Grace, ok.Timeout)
		}
		if k.BatchSize < 1 || k.BatchSize > maxBatchSize {
			return fmt.Errorf("stepwise: Config.Kinds[%q].CheckBatchSize %d: want 1 to %d", name, k.BatchSize, maxBatchSize)
		}
		if k.Concurrency < 1 || k.Concurrency > 10000 {
			return fmt.Errorf("stepwise: Config.Kinds[%q].CheckConcurrency %d: want 1 to 10000", name, k.Concurrency)
		}
		if k.RatePerSecond < 0 {
			return fmt.Errorf("stepwise: Config.Kinds[%q].CheckRatePerSecond %v is negative; use 0 for no limit", name, k.RatePerSecond)
		}
		if k.Timeout < 0 || k.GiveUpAfter < 0 || k.MaxChecks < 0 {
			return fmt.Errorf("stepwise: Config.Kinds[%q]: CheckTimeout, GiveUpAfter and MaxChecks must not be negative", name)
		}
	}
	if c.Interval < time.Second {
		return fmt.Errorf("stepwise: Config.Reconcile.Interval %s is below River's minimum period of 1s", c.Interval)
	}
	if c.Slice < time.Second {
		return fmt.Errorf("stepwise: Config.Reconcile.Slice %s: want at least 1s", c.Slice)
	}
	return nil
}
