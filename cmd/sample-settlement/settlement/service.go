package settlement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/schedule"
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

// Service is one worker process's worth of the settlement service: a River client with the
// settle step function, the payout outbox (delivery), the reconciler (UNKNOWN_EXTERNAL
// payouts), Stepwise's maintenance (fast takeover) and optionally the daily schedule. It is
// wired in the open, the way a user adds Stepwise to their own River client, every part the
// same way (New, Install, river.NewClient; then RunMaintenance and Collectors): read
// NewService.
type Service struct {
	Pool       *pgxpool.Pool
	Client     *river.Client[pgx.Tx]
	Engine     *workflow.Engine
	Outbox     *outbox.Outbox
	Reconciler *reconcile.Reconciler
	Scheduler  *schedule.Scheduler // nil unless ServiceConfig.Schedule
	Plan       Plan
	Bank       Bank

	cfg *ServiceConfig
}

// NewService wires a Service on pool. Start it with Start.
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
	wcfg := cfg.Workflow.WithDefaults()
	if cfg.Workflow == nil {
		wcfg.Logger = cfg.Logger
	}
	engine, err := workflow.New(pool, wcfg)
	if err != nil {
		return nil, err
	}
	ob, err := outbox.New(pool, &outbox.Config{
		ID:     cfg.ID,
		Logger: cfg.Logger,
		Kinds: map[string]*outbox.KindConfig{
			PayoutKind: {
				Sender:         cfg.Bank, // pays under the operation id, classifies the answer
				OnOutcomeBatch: OnPayoutOutcomes,
				Concurrency:    cfg.PayoutConcurrency,
				Timeout:        cfg.PayoutTimeout,
				Lease:          cfg.PayoutLease,
				RetryBackoff:   cfg.PayoutRetryBackoff,
			},
		},
	})
	if err != nil {
		return nil, err
	}

	rec, err := reconcile.New(pool, &reconcile.Config{
		Outbox:   ob,
		Interval: cfg.ReconcileInterval,
		Logger:   cfg.Logger,
		Kinds: map[string]*reconcile.KindConfig{
			PayoutKind: {
				Checker:      cfg.Bank, // looks the operation id up
				Timeout:      cfg.PayoutTimeout,
				Grace:        cfg.ReconcileGrace,
				CheckBackoff: cfg.ReconcileBackoff,
			},
		},
	})
	if err != nil {
		return nil, err
	}

	// One wiring for every part: New, Install(rc) for each, river.NewClient, then
	// RunMaintenance of each in every process (Service.RunMaintenance) and Metrics of each
	// registered (Service.Collectors).
	rc := &river.Config{
		ID:     cfg.ID,
		Logger: cfg.Logger,
		Queues: map[string]river.QueueConfig{
			river.QueueDefault: {MaxWorkers: 4}, // Stepwise maintenance and schedule ticks
			SettleQueue:        {MaxWorkers: cfg.SettleWorkers},
		},
		Workers:           river.NewWorkers(),
		FetchPollInterval: cfg.FetchPollInterval,
		Middleware:        cfg.RiverMiddleware,
	}
	if err := workflow.AddWorkerSafely(engine, rc.Workers, &SettleWorker{BatchSize: cfg.BatchSize}); err != nil {
		return nil, err
	}
	if err := engine.Install(rc); err != nil {
		return nil, err
	}
	if err := ob.Install(rc); err != nil {
		return nil, err
	}
	if err := rec.Install(rc); err != nil {
		return nil, err
	}
	var sched *schedule.Scheduler
	if cfg.Schedule {
		if sched, err = schedule.New(engine, &schedule.Config{Logger: cfg.Logger}); err != nil {
			return nil, err
		}
		s, err := plan.Schedule()
		if err != nil {
			return nil, err
		}
		if err := schedule.Add(sched, s); err != nil {
			return nil, err
		}
		if err := sched.Install(rc); err != nil {
			return nil, err
		}
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return nil, fmt.Errorf("creating the River client: %w", err)
	}
	return &Service{Pool: pool, Client: client, Engine: engine, Outbox: ob, Reconciler: rec, Scheduler: sched, Plan: plan, Bank: cfg.Bank, cfg: cfg}, nil
}

// Start starts the River client: settle runs, payout delivery, maintenance and (if
// configured) the schedule are worked from now on.
func (s *Service) Start(ctx context.Context) error {
	if err := s.Client.Start(ctx); err != nil {
		return fmt.Errorf("starting the River client: %w", err)
	}
	return nil
}

// Stop shuts down gracefully: River stops fetching and waits for in-flight steps and sends
// to finish, up to soft; then their contexts are cancelled (StopAndCancel) and whatever was
// mid-step rolls back, its lease released or left to expire, so another process resumes
// it from the last committed cursor. A send cut short ends UNKNOWN_EXTERNAL, never lost.
func (s *Service) Stop(ctx context.Context, soft time.Duration) error {
	softCtx, cancel := context.WithTimeout(ctx, soft)
	defer cancel()
	err := s.Client.Stop(softCtx)
	if err == nil {
		return nil
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("stopping the River client: %w", err)
	}
	hardCtx, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel2()
	if err := s.Client.StopAndCancel(hardCtx); err != nil {
		return fmt.Errorf("stopping the River client (cancelling in-flight work after %s): %w", soft, err)
	}
	return nil
}

// StartDateActor is who StartDate records as having started a date's slot by hand.
const StartDateActor = "sample-settlement"

// StartDate starts (or finds started) the runs that settle date, in one transaction, recorded
// as started by hand by StartDateActor.
func (s *Service) StartDate(ctx context.Context, date time.Time) (runs []*workflow.Run, created bool, err error) {
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		runs, created, err = s.Plan.Start(ctx, s.Client, tx, date, StartDateActor)
		return err
	})
	return runs, created, err
}

// RunMaintenance runs the maintenance of every part (takeover of runs whose worker died,
// outbox and reconciliation passes, schedule ticks) until ctx ends, so that none of it waits
// for River's leader. Call it in a goroutine of every process, after Start.
func (s *Service) RunMaintenance(ctx context.Context) {
	var wg sync.WaitGroup
	run := func(f func(context.Context, *river.Client[pgx.Tx]) error) {
		wg.Go(func() { _ = f(ctx, s.Client) })
	}
	run(s.Engine.RunMaintenance)
	run(s.Outbox.RunMaintenance)
	run(s.Reconciler.RunMaintenance)
	if s.Scheduler != nil {
		run(s.Scheduler.RunMaintenance)
	}
	wg.Wait()
}

// Collectors returns the Prometheus collectors of the parts: workflow, outbox, reconcile and
// schedule metrics.
func (s *Service) Collectors() []prometheus.Collector {
	cs := []prometheus.Collector{s.Engine.Metrics(), s.Outbox.Metrics(), s.Reconciler.Metrics()}
	if s.Scheduler != nil {
		cs = append(cs, s.Scheduler.Metrics())
	}
	return cs
}
