package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/jitter"
)

// Sender performs operations of one kind against an external system.
//
// Send must pass op.IdempotencyKey() (the operation id) as the idempotency key, so that a
// resend after RETRYABLE or a reconciler's resend is applied at most once. It must honour
// ctx: the dispatcher gives it KindConfig.Timeout. Classify its error honestly:
//
//   - nil: the external system confirmed the operation;
//   - Permanent(err): it definitely refused it;
//   - NotSent(err): it definitely did not act on it (never reached, or said so; over HTTP,
//     outbox/httpsend tells "never reached" from what happened on the wire);
//   - anything else: it may have happened. The operation becomes UNKNOWN_EXTERNAL and the
//     reconciler asks the external system. This is the default on purpose.
//
// The error's text is kept in the ledger (last_error, its first KiB) and may be logged; the
// payload never is. Keep secrets out of error messages.
type Sender interface {
	Send(ctx context.Context, op *Operation) (Receipt, error)
}

// SendFunc adapts a function to Sender.
type SendFunc func(ctx context.Context, op *Operation) (Receipt, error)

// Send calls f.
func (f SendFunc) Send(ctx context.Context, op *Operation) (Receipt, error) { return f(ctx, op) }

// Receipt is what a Sender learned from a successful send.
type Receipt struct {
	// ExternalRef is the external system's reference for the effect (a payment id), kept in
	// the ledger for support and reconciliation.
	ExternalRef string
}

// Outcome is a transition the ledger recorded, as told to an OutcomeFunc.
type Outcome struct {
	From State
	To   State
	// Actor is who moved the operation: "outbox/<id>" for a dispatcher, "reconcile" for the
	// reconciler, a person's name for a manual resolution.
	Actor string
	// ExternalRef is the external system's reference, when known.
	ExternalRef string
	// Error is the (bounded) error that caused the move, if any.
	Error string
	// Reason explains a move to MANUAL or a manual resolution.
	Reason string
}

// OutcomeFunc is called in the transaction that records a transition, so that business state
// moves with the ledger: a settlement becomes PAID exactly when its payout becomes SUCCEEDED,
// and neither commits without the other. It is called once per recorded transition out of
// PROCESSING, UNKNOWN_EXTERNAL and MANUAL (not for claims), with the operation as it is after
// the move. Returning an error rolls the transition back; it is then retried.
type OutcomeFunc func(ctx context.Context, tx pgx.Tx, op *Operation, outcome Outcome) error

// OutcomeBatchFunc is the set-based form of OutcomeFunc: one call per recorded batch, for a
// callback that updates business rows with one statement instead of one per operation.
type OutcomeBatchFunc func(ctx context.Context, tx pgx.Tx, batch []OperationOutcome) error

// OperationOutcome pairs an operation with its recorded outcome.
type OperationOutcome struct {
	Op      *Operation
	Outcome Outcome
}

// KindConfig configures the delivery of one kind of operation.
type KindConfig struct {
	// Sender performs the operations. Required.
	Sender Sender

	// OnOutcome is called in the transaction of each recorded transition. Optional; at most
	// one of OnOutcome and OnOutcomeBatch.
	OnOutcome OutcomeFunc

	// OnOutcomeBatch is called once per recorded batch of transitions, in its transaction.
	// Optional; at most one of OnOutcome and OnOutcomeBatch.
	OnOutcomeBatch OutcomeBatchFunc

	// BatchSize is how many due operations a dispatcher claims with one statement, and at
	// most how many outcomes it records in one transaction. Claiming, sending and recording
	// overlap: a slow send holds up its own operation, not its batch. A new batch is claimed
	// while earlier ones are still being sent, so it need not grow with Concurrency: against
	// a 200ms bank at Concurrency 256, 512 delivered no faster than 200.
	//
	// Defaults to BatchSizeDefault (200).
	BatchSize int

	// Concurrency is how many Send calls of this kind run at once in one process. It is
	// the knob of delivery's throughput against a real external system: one process
	// delivers at most Concurrency / latency operations per second (16 sends at once to a
	// bank answering in 200ms: 80/s; 256: 1,280/s). The bench's slowbank section reached
	// 0.91-0.98 of that in a full run with no CPU stolen by its host (on loaded machines
	// 0.83-0.97 at 16, as low as 0.49 at 256) until the ledger's own write rate caps it
	// (outcomes are recorded one transaction at a time), past which more Concurrency does
	// not help: see "Against a real bank" in docs/design.md.
	// Size it as target rate × the external system's typical latency, within what that
	// system allows (its rate limit: see RatePerSecond). Senders hold no database connection: a
	// dispatcher uses a handful of the pool's per kind (the claim, the recorder, the lease
	// renewer, its heartbeat) whatever Concurrency is, so size the pool by River's workers,
	// not by this. Give the Sender's HTTP client as many idle connections per host
	// (http.Transport.MaxIdleConnsPerHost) as Concurrency, or each send beyond them opens
	// and closes a connection.
	//
	// Defaults to ConcurrencyDefault (16): polite to an external system nobody has sized
	// yet, and enough for 80-320 operations/s at 50-200ms.
	Concurrency int

	// RatePerSecond caps Send calls per second for this kind in one process, so that a burst
	// does not trip the external system's own rate limit.
	//
	// Defaults to 0: no limit.
	RatePerSecond float64

	// Timeout bounds each Send call. A send that times out is UNKNOWN_EXTERNAL, not failed.
	//
	// Defaults to TimeoutDefault (30s).
	Timeout time.Duration

	// Lease is how long a claim protects an operation in PROCESSING without being renewed.
	// A live dispatcher renews the leases of the operations it holds (while they wait for a
	// sender, are being sent, or are being recorded), so Lease is how long after a crash —
	// kill -9, a frozen VM, a lost network — its operations are declared UNKNOWN_EXTERNAL:
	// they may have been sent, so they go to the reconciler, never back to the senders.
	// Renewal stops after the longest a batch can legitimately take (every send timing out),
	// so a Sender that ignores its context cannot hold an operation forever.
	//
	// No Send starts unless the claim is certainly valid for at least Timeout (a claim that
	// falls short is renewed once, or dropped unsent), so Lease must be longer than Timeout;
	// twice Timeout or more keeps renewals off the sending path.
	//
	// Defaults to LeaseDefault (1m).
	Lease time.Duration

	// RetryBackoff is the wait before the attempt-th resend of a RETRYABLE operation.
	//
	// Defaults to DefaultRetryBackoff: 1s doubling to 10m, with jitter.
	RetryBackoff func(attempt int) time.Duration

	// MaxAttempts is how many times an operation is sent (all RETRYABLE) before it is moved to
	// MANUAL with the reason, for a person to decide.
	//
	// Defaults to MaxAttemptsDefault (25). -1 retries forever.
	MaxAttempts int
}

// Config configures an Outbox.
type Config struct {
	// Kinds configures each kind of operation this process delivers. Required; at least one.
	Kinds map[string]*KindConfig

	// ID names this process in the ledger's lease (leased_by) and audit events.
	//
	// Defaults to "<hostname>/<pid>".
	ID string

	// Logger receives what cannot be returned: a batch whose outcome callback keeps failing.
	//
	// Defaults to slog.Default(). Records logged inside a traced send carry its trace_id
	// and span_id.
	Logger *slog.Logger

	// TracerProvider gives the tracer of the "stepwise.send" span of each send, linked to
	// the span that enqueued the operation (docs/design.md, *Tracing*). Nil means
	// otel.GetTracerProvider(), a no-op until the application installs a provider;
	// Stepwise never configures an exporter itself.
	TracerProvider trace.TracerProvider

	// PollInterval is how often the poll (a River periodic job, run on the leader, and by
	// RunMaintenance in every process that calls it) looks for
	// due operations that no dispatcher was woken for: operations enqueued outside a River
	// worker, RETRYABLE ones whose backoff elapsed, and PROCESSING ones whose lease expired.
	//
	// Defaults to 1s, River's minimum for a periodic job.
	PollInterval time.Duration

	// Slice is how long one dispatcher job delivers before it returns to River and queues
	// itself again, so that a busy kind never looks stuck to River and the job's timeout
	// stays bounded.
	//
	// Defaults to 30s.
	Slice time.Duration

	// DispatcherLease is how long a kind's dispatcher may go without proving it is alive
	// (it heartbeats every DispatcherLease/4) before the poll starts a takeover dispatcher
	// beside it. River keeps the job of a killed process "running" for an hour, and that job
	// swallows the wakes of the kind until a takeover has heartbeated (after that the waker
	// passes the dead job): delivery after a kill -9 resumes about DispatcherLease +
	// PollInterval later (run RunMaintenance in every process, so that a dead River leader
	// does not add its failover). Shorter recovers faster but risks a
	// takeover beside a dispatcher stalled on a slow database; a takeover beside a live
	// dispatcher is safe (claims skip locked rows, outcomes are fenced by claim), only
	// wasteful.
	//
	// Defaults to 5s.
	DispatcherLease time.Duration
}

// Defaults of Config and KindConfig: the value an unset (zero) field takes.
const (
	DispatcherLeaseDefault = 5 * time.Second  // Config.DispatcherLease
	PollIntervalDefault    = time.Second      // Config.PollInterval
	SliceDefault           = 30 * time.Second // Config.Slice
	BatchSizeDefault       = 200              // KindConfig.BatchSize
	ConcurrencyDefault     = 16               // KindConfig.Concurrency
	TimeoutDefault         = 30 * time.Second // KindConfig.Timeout
	LeaseDefault           = time.Minute      // KindConfig.Lease
	MaxAttemptsDefault     = 25               // KindConfig.MaxAttempts
)

// DefaultRetryBackoff waits 1s, 2s, 4s, ... up to 10 minutes before the attempt-th resend,
// each with ±25% jitter, so that the operations refused in one burst do not return in one.
func DefaultRetryBackoff(attempt int) time.Duration {
	return jitter.Doubling(time.Second, 10*time.Minute, attempt)
}

// WithDefaults returns a copy of the config with every unset field at its default. Kind
// configs are copied too.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.ID == "" {
		host, _ := os.Hostname()
		out.ID = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.PollInterval == 0 {
		out.PollInterval = PollIntervalDefault
	}
	if out.Slice == 0 {
		out.Slice = SliceDefault
	}
	if out.DispatcherLease == 0 {
		out.DispatcherLease = DispatcherLeaseDefault
	}
	kinds := make(map[string]*KindConfig, len(out.Kinds))
	for name, kc := range out.Kinds {
		if kc == nil {
			kinds[name] = nil
			continue
		}
		k := kc.withDefaults()
		kinds[name] = &k
	}
	out.Kinds = kinds
	return &out
}

func (k KindConfig) withDefaults() KindConfig {
	if k.BatchSize == 0 {
		k.BatchSize = BatchSizeDefault
	}
	if k.Concurrency == 0 {
		k.Concurrency = ConcurrencyDefault
	}
	if k.Timeout == 0 {
		k.Timeout = TimeoutDefault
	}
	if k.Lease == 0 {
		k.Lease = LeaseDefault
	}
	if k.RetryBackoff == nil {
		k.RetryBackoff = DefaultRetryBackoff
	}
	if k.MaxAttempts == 0 {
		k.MaxAttempts = MaxAttemptsDefault
	}
	return k
}

// holdLimit is the longest a dispatcher may legitimately hold an operation it claimed: behind
// up to Concurrency + 2 × BatchSize outstanding (the pump claims a batch while Concurrency +
// BatchSize are outstanding), every round of sends timing out, its own send, the rate limit's
// spacing, and one more lease for claiming and recording. Leases are not renewed past it.
func (k *KindConfig) holdLimit() time.Duration {
	ahead := 2*k.BatchSize + k.Concurrency
	rounds := (ahead + k.Concurrency - 1) / k.Concurrency
	d := time.Duration(rounds+1)*k.Timeout + k.Lease
	if k.RatePerSecond > 0 {
		d += time.Duration(float64(ahead) / k.RatePerSecond * float64(time.Second))
	}
	return d
}

// validate names what is wrong as the user configured it: stepwise.Config.Kinds and
// stepwise.Config.Outbox, from which the client builds this config.
func (c *Config) validate() error {
	if len(c.Kinds) == 0 {
		return errors.New("stepwise: Config.Kinds is empty; configure at least one kind with its Sender")
	}
	names := make([]string, 0, len(c.Kinds))
	for name := range c.Kinds {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		k := c.Kinds[name]
		if err := ValidateKind(name); err != nil {
			return fmt.Errorf("stepwise: Config.Kinds: %w", err)
		}
		if k == nil {
			return fmt.Errorf("stepwise: Config.Kinds[%q] is nil; give it a KindConfig with a Sender", name)
		}
		if k.Sender == nil {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Sender is nil; every kind needs a Sender", name)
		}
		if k.OnOutcome != nil && k.OnOutcomeBatch != nil {
			return fmt.Errorf("stepwise: Config.Kinds[%q]: both OnOutcome and OnOutcomeBatch are set; keep one", name)
		}
		if k.BatchSize < 1 || k.BatchSize > 10000 {
			return fmt.Errorf("stepwise: Config.Kinds[%q].BatchSize %d: want 1 to 10000", name, k.BatchSize)
		}
		if k.Concurrency < 1 || k.Concurrency > 10000 {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Concurrency %d: want 1 to 10000", name, k.Concurrency)
		}
		if k.RatePerSecond < 0 {
			return fmt.Errorf("stepwise: Config.Kinds[%q].RatePerSecond %v is negative; use 0 for no limit", name, k.RatePerSecond)
		}
		if k.Timeout < 0 {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Timeout %s is negative", name, k.Timeout)
		}
		if k.Lease < time.Second {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Lease %s: want at least 1s; the dispatcher renews it several times per Lease, "+
				"and a lease that lapses under a live dispatcher turns its operations UNKNOWN_EXTERNAL", name, k.Lease)
		}
		if k.Lease <= k.Timeout {
			return fmt.Errorf("stepwise: Config.Kinds[%q].Lease %s is not longer than Timeout %s; no Send starts unless its claim "+
				"outlasts the send timeout, so make Lease at least twice Timeout (the default Lease is %s for the default %s Timeout)",
				name, k.Lease, k.Timeout, LeaseDefault, TimeoutDefault)
		}
		if k.MaxAttempts < -1 {
			return fmt.Errorf("stepwise: Config.Kinds[%q].MaxAttempts %d: want a positive count, or -1 for no limit", name, k.MaxAttempts)
		}
	}
	if c.PollInterval < time.Second {
		return fmt.Errorf("stepwise: Config.Outbox.PollInterval %s is below River's minimum period of 1s", c.PollInterval)
	}
	if c.Slice < time.Second {
		return fmt.Errorf("stepwise: Config.Outbox.Slice %s: want at least 1s", c.Slice)
	}
	if c.DispatcherLease < time.Second {
		return fmt.Errorf("stepwise: Config.Outbox.DispatcherLease %s: want at least 1s (0 means the default, %s); the dispatcher "+
			"heartbeats every DispatcherLease/4, and a shorter lease would start takeovers beside live dispatchers",
			c.DispatcherLease, DispatcherLeaseDefault)
	}
	return nil
}
