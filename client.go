package stepwise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/jitter"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	schedengine "github.com/stepwise-go/stepwise/internal/schedule"
	wfengine "github.com/stepwise-go/stepwise/internal/workflow"
)

// Client is Stepwise's one handle, as river.Client is River's: it owns the River client it
// was built with, the step engine, the operation ledger's dispatchers, the reconciler and the
// scheduler. Build it with NewClient, register steppers with AddWorker before, then Start
// and, on shutdown, Stop.
type Client struct {
	pool       *pgxpool.Pool
	config     *Config
	river      *river.Client[pgx.Tx]
	engine     *wfengine.Engine
	outbox     *outbox.Outbox        // nil when the config has no kinds
	reconciler *reconcile.Reconciler // nil when no kind has a Checker
	// resolver records a person's decisions (OperationResolve) through the client's outbox,
	// with the kinds' callbacks: the reconciler, or, when no kind has a Checker, one that is
	// never installed and never looks anything up. nil when the config has no kinds.
	resolver  *reconcile.Reconciler
	scheduler *schedengine.Scheduler // nil when the config has no schedules
	// local is what outbox.Enqueue keeps for this client (the waker that wakes dispatchers
	// after the enqueuing commit, the kinds known registered): the outbox's, or, in a client
	// without kinds (one that enqueues only), one of its own. Every job the client works, and
	// OperationEnqueueTx, carry it in their context.
	local *outbox.Local
	// wakes is the River client dispatcher jobs are queued through (the waker's, and a
	// RETRYABLE resolution's in its transaction): the client's own, or, in a client without
	// kinds, whose Workers have no dispatcher worker that River would check the kind against,
	// an insert-only one on the same pool.
	wakes   *river.Client[pgx.Tx]
	metrics *clientMetrics
	logger  *slog.Logger

	mu         sync.Mutex
	started    bool
	stopped    bool               // Stop or StopAndCancel ended it: the engine and outbox stay quiesced
	noMorePass chan struct{}      // closed by Stop: no maintenance pass begins
	cancelPass context.CancelFunc // cancels the passes in flight
	maintDone  chan struct{}      // closed when the maintenance loop has ended
}

// NewClient builds a Client on pool: the step engine, the outbox (when Config.Kinds has
// kinds), the reconciler (when a kind has a Checker) and the scheduler (when Config.Schedules
// has schedules), installs their workers, queues, periodic jobs and worker middleware into a
// copy of config.River, and builds the River client on it. It checks that pool has enough
// connections for the config: it refuses one with fewer than every River worker (Stepwise's
// queues included) plus River's two and the maintenance loop's one, with an error that names
// the pool_max_conns to set, and logs a warning for one below what runs without waiting.
//
// Nothing runs until Start.
func NewClient(pool *pgxpool.Pool, config *Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("stepwise.NewClient: pool is nil; pass the *pgxpool.Pool of the database migrations.Migrate prepared")
	}
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{pool: pool, config: cfg, logger: cfg.Logger, metrics: newClientMetrics()}
	var err error
	if c.engine, err = wfengine.New(pool, cfg.Workflow); err != nil {
		return nil, err
	}
	if len(cfg.Kinds) > 0 {
		if c.outbox, err = outbox.New(pool, cfg.outboxConfig()); err != nil {
			return nil, err
		}
		if rc := cfg.reconcileConfig(c.outbox); rc != nil {
			if c.reconciler, err = reconcile.New(pool, rc); err != nil {
				return nil, err
			}
			c.resolver = c.reconciler
		} else {
			// Guards against a kind nobody can look up (no Checker anywhere), which only a
			// person can settle, being unresolvable with its callback.
			c.resolver = reconcile.NewResolver(pool, c.outbox)
		}
	}
	if len(cfg.Schedules) > 0 {
		if c.scheduler, err = schedengine.New(c.engine, cfg.Scheduler); err != nil {
			return nil, err
		}
		for _, s := range cfg.Schedules {
			if err := s.AddTo(c.scheduler); err != nil {
				return nil, err
			}
		}
	}

	// Install each component into the (copied) River config: workers, periodic jobs (run by
	// River's leader; the maintenance loop runs the same passes in every process), queues,
	// and the engine's worker middleware that steppers added with AddWorker find it by.
	rc := cfg.River
	for _, install := range c.installs() {
		if err := install(rc); err != nil {
			return nil, err
		}
	}
	if c.outbox != nil {
		c.local = c.outbox.Local() // Install added its middleware
	} else {
		c.local = outbox.NewLocal()
		rc.Plugins = append(rc.Plugins, c.local.Middleware())
		// A client that enqueues kinds another process delivers has no dispatcher worker,
		// and River refuses to insert a job kind its Workers lack: its wakes go through an
		// insert-only River client on the same pool (no Workers, so no such check).
		if c.wakes, err = river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: cfg.Logger}); err != nil {
			return nil, err
		}
		c.local.WakeThrough(c.wakes)
	}
	if err := checkPoolSize(pool, rc, cfg, len(c.maintenancePasses()), c.logger); err != nil {
		return nil, err
	}
	if c.river, err = river.NewClient(riverpgxv5.New(pool), rc); err != nil {
		return nil, err
	}
	if c.wakes == nil {
		c.wakes = c.river
	}
	for _, kind := range cfg.kindsWithoutChecker() {
		c.metrics.withoutChecker.WithLabelValues(kind).Set(1)
	}
	return c, nil
}

func (c *Client) installs() []func(*river.Config) error {
	out := []func(*river.Config) error{c.engine.Install}
	if c.outbox != nil {
		out = append(out, c.outbox.Install)
	}
	if c.reconciler != nil {
		out = append(out, c.reconciler.Install)
	}
	if c.scheduler != nil {
		out = append(out, c.scheduler.Install)
	}
	return out
}

// River returns the River client, for your own inserts (river.Client.Insert, InsertTx) and
// for schedule.StartSlot.
func (c *Client) River() *river.Client[pgx.Tx] { return c.river }

// Start starts the Client, in this order:
//
//  1. It records the outbox's kinds in the database (outbox.RegisterKinds), so that
//     outbox.Enqueue accepts them. Guards against: the first Enqueue of a new kind refused
//     because no process has registered it yet.
//  2. It warns (and sets stepwise_client_kind_without_checker) for every kind this process
//     sends and cannot reconcile. Guards against: UNKNOWN_EXTERNAL operations that wait
//     forever in silence.
//  3. It starts River, with a context that ctx's cancellation does not reach: cancelling
//     River's Start context is River's hard stop, which cuts the steps and sends in flight
//     (each cut send becomes UNKNOWN_EXTERNAL). Shut down with Stop, which drains.
//  4. It starts the maintenance loop in this process: takeover of runs whose worker died,
//     the outbox's poll, reconciliation passes and schedule ticks, each at its interval.
//     Guards against: recovery waiting for River's leader, whose periodic jobs run the same
//     passes, when the process that died is the leader (a new one is elected only after
//     River's leadership TTL). Failed passes are logged and counted
//     (stepwise_client_maintenance_passes_total{result="error"}).
//
// Start on a started Client does nothing, as River's; on a stopped one it is an error.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.engine == nil {
		return errors.New("stepwise.Client.Start: this is an operator client (NewOperatorClient), which reads and acts but runs no work; a service builds its client with NewClient")
	}
	if c.started {
		return nil
	}
	if c.stopped {
		// Guards against: a restarted client whose quiesced engine and outbox begin no step
		// and no send, silently.
		return errors.New("stepwise: Start: this client was stopped, and its engine and outbox stay quiesced; build a new one with NewClient")
	}
	if c.outbox != nil {
		if err := c.outbox.Register(ctx); err != nil {
			return fmt.Errorf("stepwise: Start: %w", err)
		}
	}
	for _, kind := range c.config.kindsWithoutChecker() {
		c.logger.WarnContext(ctx, "stepwise: kind has a Sender but no Checker in this process: its UNKNOWN_EXTERNAL operations "+
			"wait until a process with a Checker reconciles them; set Config.Kinds[kind].Checker, here or in another process",
			slog.String("kind", kind))
	}
	runCtx := context.WithoutCancel(ctx)
	if err := c.river.Start(runCtx); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(runCtx)
	c.noMorePass, c.cancelPass, c.maintDone = make(chan struct{}), cancel, make(chan struct{})
	go c.maintain(mctx, c.noMorePass, c.maintDone)
	c.started = true
	return nil
}

// kindsWithoutChecker returns the kinds this process sends and does not reconcile (a Sender
// without a Checker in Config.Kinds), sorted. Their UNKNOWN_EXTERNAL operations wait for a
// process that has a Checker. Start logs them and Metrics exports them
// (stepwise_client_kind_without_checker).
func (c *Client) kindsWithoutChecker() []string {
	if c == nil || c.config == nil { // an operator client configures no kinds
		return nil
	}
	return c.config.kindsWithoutChecker()
}

// Stop drains the Client, in this order:
//
//  1. It quiesces the engine and the outbox: each step in flight commits and releases its
//     run's lease at its step boundary, no new step or send begins, and the sends in flight
//     get their answers recorded. Guards against: leases left to lapse and sends cut
//     mid-flight, which would become UNKNOWN_EXTERNAL.
//  2. It stops River softly (river.Client.Stop): no job is fetched, the jobs in flight
//     finish. It waits Config.StopTimeout, or until ctx's deadline if sooner.
//  3. Past that, it stops River hard (StopAndCancel): the work still in flight is
//     cancelled; a cut send becomes UNKNOWN_EXTERNAL and the reconciler settles it. Stop
//     then returns an error saying so. Guards against: a shutdown that never ends.
//  4. It ends the maintenance loop, which began no pass since step 1, and waits for it. The
//     passes in flight are cancelled only now. Guards against: a poll cut mid-way while River
//     drains (its wakes inserted with a cancelled context).
//
// Stop on a Client that is not started does nothing. A stopped Client is not started again:
// build a new one.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return nil
	}
	c.engine.Quiesce()
	if c.outbox != nil {
		c.outbox.Quiesce()
	}
	close(c.noMorePass)
	softCtx, cancel := context.WithTimeout(ctx, c.config.StopTimeout)
	defer cancel()
	start := time.Now()
	err := c.river.Stop(softCtx)
	if err != nil {
		c.logger.WarnContext(ctx, "stepwise: Stop: the drain did not finish in time; cancelling the work in flight",
			slog.Duration("waited", time.Since(start).Round(time.Millisecond)), slog.String("error", err.Error()))
		hardCtx, cancelHard := context.WithTimeout(context.WithoutCancel(ctx), c.config.StopTimeout)
		defer cancelHard()
		if herr := c.river.StopAndCancel(hardCtx); herr != nil {
			err = errors.Join(err, herr)
		}
		err = fmt.Errorf("stepwise: Stop: the drain did not finish within %s; the work still in flight was cancelled "+
			"(a cut send becomes UNKNOWN_EXTERNAL and the reconciler settles it): %w", time.Since(start).Round(time.Millisecond), err)
	}
	c.endMaintenance()
	return err
}

// StopAndCancel stops the Client hard: River's StopAndCancel cancels the steps and sends in
// flight (a cut send becomes UNKNOWN_EXTERNAL, a cut step's run is taken over after its
// lease) and waits for them to return, until ctx ends; then the maintenance loop ends.
func (c *Client) StopAndCancel(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return nil
	}
	err := c.river.StopAndCancel(ctx)
	c.endMaintenance()
	return err
}

// endMaintenance ends the maintenance loop and waits for it; c.mu is held.
func (c *Client) endMaintenance() {
	select {
	case <-c.noMorePass:
	default:
		close(c.noMorePass)
	}
	c.cancelPass()
	<-c.maintDone
	c.started, c.stopped = false, true
}

// maintenancePass is one component's pass of the maintenance loop.
type maintenancePass struct {
	component string
	interval  time.Duration
	run       func(ctx context.Context) error
}

func (c *Client) maintenancePasses() []maintenancePass {
	cfg := c.config
	out := []maintenancePass{{"workflow", cfg.Workflow.MaintenanceInterval, func(ctx context.Context) error {
		_, err := c.engine.Maintain(ctx, c.river)
		return err
	}}}
	if c.outbox != nil {
		out = append(out, maintenancePass{"outbox", cfg.Outbox.PollInterval, func(ctx context.Context) error {
			return c.outbox.Maintain(ctx, c.river)
		}})
	}
	if c.reconciler != nil {
		out = append(out, maintenancePass{"reconcile", cfg.Reconcile.Interval, func(ctx context.Context) error {
			_, err := c.reconciler.Maintain(ctx, c.river)
			return err
		}})
	}
	if c.scheduler != nil {
		out = append(out, maintenancePass{"schedule", cfg.Scheduler.TickInterval, func(ctx context.Context) error {
			_, err := c.scheduler.Tick(ctx, c.river)
			return err
		}})
	}
	return out
}

// maintain is the process's maintenance loop: each component's pass at its interval (with
// jitter, so that processes started together do not pass together), each on its own
// goroutine so that a slow reconciliation pass (lookups at a slow external system) never
// delays a takeover. Passes in several processes at once are safe (each component's
// documentation says why). No pass begins once noMore is closed; the passes in flight end
// when ctx ends. It closes done when every pass has ended.
func (c *Client) maintain(ctx context.Context, noMore <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var wg sync.WaitGroup
	for _, p := range c.maintenancePasses() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-noMore:
					return
				case <-time.After(jitter.Spread(p.interval, 0.2)):
				}
				err := p.run(ctx)
				if ctx.Err() != nil {
					return // ended by Stop: not a failure
				}
				if err != nil {
					c.metrics.passes.WithLabelValues(p.component, "error").Inc()
					c.logger.WarnContext(ctx, "stepwise: maintenance pass failed; retrying next interval",
						slog.String("component", p.component), slog.String("error", err.Error()))
					continue
				}
				c.metrics.passes.WithLabelValues(p.component, "ok").Inc()
			}
		}()
	}
	wg.Wait()
}
