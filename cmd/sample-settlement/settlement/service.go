package settlement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/workflow"
)

// ServiceConfig configures a Service.
type ServiceConfig struct {
	// Bank is the bank payouts are sent to and looked up at (the fake bank's adapter is
	// package bankfake; yours implements the same interface). Required.
	Bank Bank

	// Plan maps dates to runs. Defaults to Plan{}.WithDefaults().
	Plan Plan

	// BatchSize is the number of merchants per settle step. Defaults to BatchSizeDefault.
	BatchSize int

	// PayoutsAtRestTimeout, when positive, makes each settle run wait after its last batch,
	// up to this long at a time, for its payouts to be at rest, and the date's last shard
	// close the date and start its reconciliation run (close.go). The sample's commands use
	// PayoutsAtRestTimeoutDefault. Defaults to 0: runs end with their last batch, dates are
	// not closed.
	PayoutsAtRestTimeout time.Duration

	// SettleWorkers is how many settle runs this process works at once. Defaults to
	// Plan.Shards.
	SettleWorkers int

	// Schedule registers the daily schedule, so this process's River leader ticks it.
	// Defaults to false: dates are settled by hand (Plan.Start).
	Schedule bool

	// PayoutConcurrency is how many payouts this process sends at once. Defaults to 32.
	PayoutConcurrency int

	// PayoutTimeout bounds one payment call; a call that times out is UNKNOWN_EXTERNAL.
	// Defaults to 5s.
	PayoutTimeout time.Duration

	// PayoutLease is how long after a crash a claimed payout is declared UNKNOWN_EXTERNAL.
	// Defaults to outbox's default (1m).
	PayoutLease time.Duration

	// ReconcileInterval is how often the River leader runs a reconciliation pass over
	// UNKNOWN_EXTERNAL payouts. Defaults to 5s.
	ReconcileInterval time.Duration

	// ReconcileGrace is how long after a payout was last sent the bank's "not found" is
	// believed and the payout resent (same id); a request still in flight may land until
	// then. Must exceed PayoutTimeout. Defaults to 1m.
	ReconcileGrace time.Duration

	// PayoutRetryBackoff is the wait before the attempt-th resend of a RETRYABLE payout (one
	// the bank refused without processing it, e.g. 429). Defaults to
	// outbox.DefaultRetryBackoff (1s doubling to 10m).
	PayoutRetryBackoff func(attempt int) time.Duration
	// ReconcileBackoff is the wait before the next lookup after a failed or pending one.
	// Defaults to reconcile.DefaultCheckBackoff (5s doubling to 1h).
	ReconcileBackoff func(check int) time.Duration

	// Workflow configures the step engine (lease, slice...). Defaults to workflow's defaults.
	Workflow *workflow.Config

	// ID names this process in River, leases and audit events. Defaults to River's and the
	// outbox's own defaults.
	ID string

	// Logger receives what the parts report. Defaults to slog.Default().
	Logger *slog.Logger

	// RiverMiddleware is added to the River client's middleware: serve and demo add River's
	// otelriver when tracing is on, so River's own insert and work spans frame Stepwise's.
	RiverMiddleware []rivertype.Middleware

	// FetchPollInterval is River's poll interval (LISTEN/NOTIFY wakes it sooner). Defaults
	// to River's default.
	FetchPollInterval time.Duration
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c *ServiceConfig) WithDefaults() *ServiceConfig {
	out := ServiceConfig{}
	if c != nil {
		out = *c
	}
	out.Plan = out.Plan.WithDefaults()
	if out.BatchSize == 0 {
		out.BatchSize = BatchSizeDefault
	}
	if out.SettleWorkers == 0 {
		out.SettleWorkers = out.Plan.Shards
	}
	if out.PayoutConcurrency == 0 {
		out.PayoutConcurrency = 32
	}
	if out.PayoutTimeout == 0 {
		out.PayoutTimeout = 5 * time.Second
	}
	if out.ReconcileInterval == 0 {
		out.ReconcileInterval = 5 * time.Second
	}
	if out.ReconcileGrace == 0 {
		out.ReconcileGrace = time.Minute
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

func (c *ServiceConfig) validate() error {
	switch {
	case c.Bank == nil:
		return errors.New("ServiceConfig.Bank is nil; give it your bank's adapter (the sample's: bankfake.Dial(bankURL, timeout))")
	case c.BatchSize < 1:
		return fmt.Errorf("ServiceConfig.BatchSize is %d; want at least 1", c.BatchSize)
	case c.SettleWorkers < 1:
		return fmt.Errorf("ServiceConfig.SettleWorkers is %d; want at least 1", c.SettleWorkers)
	case c.PayoutsAtRestTimeout < 0:
		return fmt.Errorf("ServiceConfig.PayoutsAtRestTimeout is %s; want a positive duration, or 0 not to close dates", c.PayoutsAtRestTimeout)
	case c.PayoutConcurrency < 1:
		return fmt.Errorf("ServiceConfig.PayoutConcurrency is %d; want at least 1", c.PayoutConcurrency)
	case c.PayoutTimeout < 0:
		return fmt.Errorf("ServiceConfig.PayoutTimeout is %s; want a positive duration", c.PayoutTimeout)
	case c.ReconcileGrace <= c.PayoutTimeout:
		return fmt.Errorf("ServiceConfig.ReconcileGrace %s must exceed PayoutTimeout %s: a payout still in flight could land after a not-found lookup and its resend",
			c.ReconcileGrace, c.PayoutTimeout)
	}
	return nil
}

// Service is one worker process's worth of the settlement service: one stepwise.Client with
// the settle step function, the payout kind (sent to and looked up at the bank, its outcome
// moving the settlement's status), the maintenance loop (fast takeover) and optionally the
// daily schedule. It is wired the way a user adds Stepwise to their own River config: read
// NewService.
type Service struct {
	Pool   *pgxpool.Pool
	Client *stepwise.Client
	Plan   Plan
	Bank   Bank
}

// payoutKind is the payout kind's configuration: the bank pays under the operation id and
// classifies the answer (Sender), looks the id up when the outcome is unknown (Checker), lists
// what it paid (Statement), and each outcome moves the settlement's status in its transaction
// (OnOutcomeBatch).
func payoutKind(cfg *ServiceConfig) *stepwise.KindConfig {
	return &stepwise.KindConfig{
		Sender:         cfg.Bank,
		Checker:        cfg.Bank,
		Statement:      StatementOf(cfg.Bank), // the console's Totals compare the payouts with it
		OnOutcomeBatch: OnPayoutOutcomes,
		Concurrency:    cfg.PayoutConcurrency,
		Timeout:        cfg.PayoutTimeout,
		Lease:          cfg.PayoutLease,
		RetryBackoff:   cfg.PayoutRetryBackoff,
		CheckTimeout:   cfg.PayoutTimeout,
		Grace:          cfg.ReconcileGrace,
		CheckBackoff:   cfg.ReconcileBackoff,
	}
}

// NewService builds a Service on pool. Start it with Start.
func NewService(pool *pgxpool.Pool, cfg *ServiceConfig) (*Service, error) {
	if pool == nil {
		return nil, errors.New("settlement.NewService: pool is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	plan, err := cfg.Plan.Compile()
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	if err := stepwise.AddWorkerSafely(workers, &SettleWorker{BatchSize: cfg.BatchSize, PayoutsAtRestTimeout: cfg.PayoutsAtRestTimeout}); err != nil {
		return nil, err
	}
	if err := stepwise.AddWorkerSafely(workers, &reconcileWorker{pool: pool}); err != nil {
		return nil, err
	}
	if err := stepwise.AddWorkerSafely(workers, &reconcileCurrencyWorker{pool: pool, bank: cfg.Bank, plan: plan}); err != nil {
		return nil, err
	}
	scfg := &stepwise.Config{
		River: &river.Config{
			ID: cfg.ID,
			// The default queue (Stepwise's maintenance jobs and schedule ticks) and the
			// outbox's and reconciler's queues are added by NewClient.
			Queues:            map[string]river.QueueConfig{SettleQueue: {MaxWorkers: cfg.SettleWorkers}},
			Workers:           workers,
			FetchPollInterval: cfg.FetchPollInterval,
			Middleware:        cfg.RiverMiddleware,
			Logger:            cfg.Logger,
		},
		Kinds:     map[string]*stepwise.KindConfig{PayoutKind: payoutKind(cfg)},
		Workflow:  cfg.Workflow,
		Outbox:    &outbox.Config{ID: cfg.ID},
		Reconcile: &reconcile.Config{Interval: cfg.ReconcileInterval},
		Logger:    cfg.Logger,
	}
	if cfg.Schedule {
		s, err := plan.Schedule()
		if err != nil {
			return nil, err
		}
		scfg.Schedules = []stepwise.Schedule{s}
	}
	client, err := stepwise.NewClient(pool, scfg)
	if err != nil {
		return nil, err
	}
	return &Service{Pool: pool, Client: client, Plan: plan, Bank: cfg.Bank}, nil
}

// Start starts the Client: settle runs, payout delivery, reconciliation, the maintenance
// loop of this process (takeover, delivery and reconciliation passes never wait for River's
// leader) and, if configured, the schedule are worked from now on.
func (s *Service) Start(ctx context.Context) error { return s.Client.Start(ctx) }

// Stop drains the Client (stepwise.Client.Stop), bounded by soft: no new step or send
// begins, the step in flight commits and releases its run's lease, the sends in flight get
// their answers recorded. Past soft, what is still in flight is cancelled: a step rolls back
// (resumed elsewhere from its last committed cursor), a cut send ends UNKNOWN_EXTERNAL for
// the reconciler, never lost.
func (s *Service) Stop(ctx context.Context, soft time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, soft)
	defer cancel()
	return s.Client.Stop(ctx)
}

// PoolConnsFor is the connection cap of a pool that runs a Service with settleWorkers settle
// workers: stepwise.NewClient refuses a pool smaller than the River workers of every queue
// plus Stepwise's own, and warns about one below twice that. A cap, not connections opened:
// a pool opens them as work needs them.
func PoolConnsFor(settleWorkers int) int32 { return int32(2*settleWorkers + 32) }

// StartDateActor is who StartDate records as having started a date's slot by hand.
const StartDateActor = "sample-settlement"

// StartDate starts (or finds started) the runs that settle date, in one transaction, recorded
// as started by hand by StartDateActor.
func (s *Service) StartDate(ctx context.Context, date time.Time) (runs []*workflow.Run, created bool, err error) {
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		runs, created, err = s.Plan.Start(ctx, s.Client.River(), tx, date, StartDateActor)
		return err
	})
	return runs, created, err
}

// Collectors returns the Prometheus collectors of the Client: workflow, outbox, reconcile,
// schedule and maintenance-loop metrics.
func (s *Service) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.Client.Metrics()}
}
