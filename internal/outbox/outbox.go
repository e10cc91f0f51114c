package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/tracing"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// DB is what the Outbox (and the Reconciler and the console) need of a database handle:
// stepwisetype.DBTX plus Begin, because they open transactions of their own (to claim a batch, to
// record its outcomes). *pgxpool.Pool satisfies it; pass the pool your River client uses.
type DB interface {
	stepwisetype.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PollQueue is the River queue of the poll job.
const PollQueue = "stepwise_outbox"

// heartbeatEvery is how often a running dispatcher proves it is alive: four beats per
// Config.DispatcherLease, so that one slow beat does not start a takeover.
func (o *Outbox) heartbeatEvery() time.Duration { return o.config.DispatcherLease / 4 }

// dispatchUniqueStates are the River states in which a dispatcher counts as already queued.
// River requires available, pending, running and scheduled; retryable is added so that a
// failing dispatcher backs off instead of being doubled by every wake.
var dispatchUniqueStates = []rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning,
	rivertype.JobStateScheduled, rivertype.JobStateRetryable,
}

// Outbox delivers the operations of the configured kinds: River workers and a periodic poll
// that the user adds to their own River client, plus methods to deliver on demand.
type Outbox struct {
	db        DB
	config    *Config
	kinds     map[string]*kindState
	kindNames []string
	actor     string
	metrics   *metrics
	tracer    trace.Tracer

	// draining is set by Quiesce: dispatchers claim and send nothing more.
	draining atomic.Bool
	// local is what Enqueue keeps for the client this Outbox is installed in (its waker and
	// the kinds known registered); Install's middleware puts it in every job's context.
	local *Local
}

type kindState struct {
	name    string
	cfg     *KindConfig
	limiter *rate.Limiter
	book    *claimBook

	mu         sync.Mutex
	lastExpiry time.Time
}

// New returns an Outbox for the kinds in config. db is the pool the River client uses.
func New(db DB, config *Config) (*Outbox, error) {
	if db == nil {
		return nil, errors.New("outbox.New: db is nil; pass the *pgxpool.Pool your River client uses")
	}
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Logger = tracing.Logger(cfg.Logger) // records logged inside a span carry its ids
	o := &Outbox{
		db:     db,
		config: cfg,
		kinds:  make(map[string]*kindState, len(cfg.Kinds)),
		local:  NewLocal(),
		// The random part tells this instance from a predecessor with the same ID (a pod
		// restarted with the same name and pid): leases are renewed by owner, and a new
		// instance must never keep alive the claims of a dead one.
		actor:   "outbox/" + cfg.ID + "#" + strconv.FormatUint(rand.Uint64()&0xffffff, 16),
		metrics: newMetrics(),
		tracer:  tracing.Tracer(cfg.TracerProvider),
	}
	for name, kc := range cfg.Kinds {
		o.kinds[name] = &kindState{name: name, cfg: kc, limiter: newLimiter(kc.RatePerSecond), book: newClaimBook()}
		o.kindNames = append(o.kindNames, name)
	}
	sort.Strings(o.kindNames)
	o.metrics.db = db
	o.metrics.kinds = o.kindNames
	return o, nil
}

// Kinds returns the configured kinds, sorted.
func (o *Outbox) Kinds() []string { return append([]string(nil), o.kindNames...) }

// KindConfig returns the effective (defaulted) configuration of kind, or nil.
func (o *Outbox) KindConfig(kind string) *KindConfig {
	if ks, ok := o.kinds[kind]; ok {
		c := *ks.cfg
		return &c
	}
	return nil
}

// addWorkers registers the Outbox's River workers (dispatcher and poll) on workers. It does not
// touch the database: recording the kinds is Register's, which takes a context (the
// stepwise.Client's Start calls it).
func (o *Outbox) addWorkers(workers *river.Workers) error {
	if err := river.AddWorkerSafely[dispatchArgs](workers, &dispatchWorker{o: o}); err != nil {
		return fmt.Errorf("outbox: Install: adding the dispatcher: %w", err)
	}
	if err := river.AddWorkerSafely[pollArgs](workers, &pollWorker{o: o}); err != nil {
		return fmt.Errorf("outbox: Install: adding the poll: %w", err)
	}
	return nil
}

// periodicJobs returns the poll. River runs periodic jobs on its elected leader only, hence
// RunMaintenance in every process.
func (o *Outbox) periodicJobs() []*river.PeriodicJob {
	kinds := o.Kinds()
	return []*river.PeriodicJob{river.NewPeriodicJob(
		river.PeriodicInterval(o.config.PollInterval),
		func() (river.JobArgs, *river.InsertOpts) {
			// One poll per period even if two leaders overlap for a moment.
			return pollArgs{Kinds: kinds}, &river.InsertOpts{
				Queue: PollQueue, MaxAttempts: 1,
				UniqueOpts: river.UniqueOpts{ByPeriod: o.config.PollInterval},
			}
		},
		&river.PeriodicJobOpts{ID: "stepwise_outbox_poll", RunOnStart: true},
	)}
}

// queues returns the River queues the Outbox's jobs run in: one per kind, so that a slow external system holds up its own kind only,
// and PollQueue. Each holds at most one dispatcher (plus a takeover after a crash); the
// concurrency of sends is KindConfig.Concurrency, inside the dispatcher.
func (o *Outbox) queues() map[string]river.QueueConfig {
	q := map[string]river.QueueConfig{PollQueue: {MaxWorkers: 2}}
	for _, k := range o.kindNames {
		q[QueueName(k)] = river.QueueConfig{MaxWorkers: 2}
	}
	return q
}

// Local is what Enqueue keeps for the client this Outbox is installed in: see Local.
func (o *Outbox) Local() *Local { return o.local }

// InstallWithoutDelivery adds to rc what a client needs to enqueue and wake the Outbox's
// kinds without delivering them: the dispatcher's worker (River refuses to insert a job kind
// its Workers bundle lacks) and the Local's middleware, but neither the kinds' queues nor the
// poll. For benchmarks of the step path, which must not deliver on the same cores.
func (o *Outbox) InstallWithoutDelivery(rc *river.Config) error {
	if rc == nil {
		return errors.New("outbox: InstallWithoutDelivery: the River config is nil")
	}
	return o.installEnqueuing(rc)
}

// installEnqueuing adds to rc the dispatchers' worker and the Local's middleware: what
// enqueuing and waking need, delivering or not.
func (o *Outbox) installEnqueuing(rc *river.Config) error {
	if rc.Workers == nil {
		rc.Workers = river.NewWorkers()
	}
	if err := o.addWorkers(rc.Workers); err != nil {
		return err
	}
	// As a plugin, which River accepts beside either form of middleware config.
	rc.Plugins = append(rc.Plugins, o.local.Middleware())
	return nil
}

// Install adds the Outbox's workers (a dispatcher per kind and the poll), its periodic poll and
// its queues (PollQueue and QueueName of each kind) to a River client config, before
// river.NewClient. Queues already in the config are left as configured. Like river.NewClient
// it does not touch the database; record the kinds with Register before the first Enqueue
// (stepwise.Client.Start does both). Then call RunMaintenance in every process, and register
// Metrics with your Prometheus registry:
//
//	if err := ob.Install(riverConfig); err != nil { ... }
//	client, err := river.NewClient(riverpgxv5.New(pool), riverConfig)
//	if err := ob.Register(ctx); err != nil { ... }
//	go ob.RunMaintenance(ctx, client)
func (o *Outbox) Install(rc *river.Config) error {
	if rc == nil {
		return errors.New("outbox: Install: the River config is nil; pass the *river.Config you give river.NewClient")
	}
	if err := o.installEnqueuing(rc); err != nil {
		return err
	}
	rc.PeriodicJobs = append(rc.PeriodicJobs, o.periodicJobs()...)
	if rc.Queues == nil {
		rc.Queues = map[string]river.QueueConfig{}
	}
	for name, qc := range o.queues() {
		if _, ok := rc.Queues[name]; !ok {
			rc.Queues[name] = qc
		}
	}
	return nil
}

type dispatchWorker struct {
	river.WorkerDefaults[dispatchArgs]
	o *Outbox
}

// Timeout covers one slice plus the longest the operations in flight when it ends may take
// (the kind's hold limit). A dispatcher never runs longer: it stops claiming at the end of its
// slice, finishes what it holds and snoozes itself.
func (w *dispatchWorker) Timeout(job *river.Job[dispatchArgs]) time.Duration {
	if ks, ok := w.o.kinds[job.Args.OperationKind]; ok {
		return w.o.config.Slice + ks.cfg.holdLimit() + time.Minute
	}
	return 0
}

// NextRetry keeps a failing dispatcher (the database was unreachable, say) coming back within
// seconds rather than River's default hours-long backoff: while it waits as "retryable" its
// uniqueness swallows every wake of the kind, and delivery would wait with it.
func (w *dispatchWorker) NextRetry(job *river.Job[dispatchArgs]) time.Time {
	return time.Now().Add(min(time.Duration(job.Attempt)*time.Second, 30*time.Second))
}

func (w *dispatchWorker) Work(ctx context.Context, job *river.Job[dispatchArgs]) error {
	return w.o.dispatch(ctx, job)
}

// pollArgs is the periodic River job that wakes dispatchers for due work nobody woke them for.
type pollArgs struct {
	Kinds []string `json:"kinds"`
}

// Kind is the River job kind.
func (pollArgs) Kind() string { return "stepwise_outbox_poll" }

// InsertOpts puts the poll in PollQueue. It is deliberately not unique by state: River
// keeps the job of a killed process "running" until its rescuer runs (an hour by default),
// and a poll unique among running jobs would then be skipped for that hour, and with it
// every takeover. Install's periodic job makes it unique per poll period instead.
func (pollArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: PollQueue, MaxAttempts: 1}
}

type pollWorker struct {
	river.WorkerDefaults[pollArgs]
	o *Outbox
}

func (w *pollWorker) Timeout(*river.Job[pollArgs]) time.Duration { return 30 * time.Second }

func (w *pollWorker) Work(ctx context.Context, job *river.Job[pollArgs]) error {
	_, err := w.o.poll(ctx, job.Args.Kinds)
	return err
}

// poll wakes the dispatcher of every kind that has due work: PENDING or RETRYABLE operations
// whose time has come, or PROCESSING ones whose lease expired. When the wake is swallowed by a
// dispatcher job that River still calls running but that stopped heartbeating (its process
// was killed), it queues a takeover dispatcher named after that job.
func (o *Outbox) poll(ctx context.Context, kinds []string) ([]string, error) {
	client := clientFrom(ctx)
	if client == nil {
		return nil, errors.New("outbox: poll needs a River client in its context; run it as a River job")
	}
	rows, err := o.db.Query(ctx, `
		SELECT k,
			coalesce((SELECT heartbeat_at > now() - $2::interval FROM stepwise_outbox_dispatcher d WHERE d.kind = k), false)
		FROM unnest($1::text[]) AS k
		WHERE EXISTS (SELECT 1 FROM stepwise_operation
				WHERE kind = k AND state IN ('PENDING', 'RETRYABLE') AND next_attempt_at <= now())
			OR EXISTS (SELECT 1 FROM stepwise_operation
				WHERE kind = k AND state = 'PROCESSING' AND lease_until < now())`,
		kinds, o.config.DispatcherLease)
	if err != nil {
		return nil, fmt.Errorf("finding kinds with due operations: %w", err)
	}
	type due struct {
		kind  string
		alive bool
	}
	dues, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		return d, r.Scan(&d.kind, &d.alive)
	})
	if err != nil {
		return nil, fmt.Errorf("finding kinds with due operations: %w", err)
	}
	var woken []string
	for _, d := range dues {
		// Crash recovery needs no dispatcher: settle expired leases here, so that an operation
		// of a killed dispatcher is UNKNOWN_EXTERNAL about a lease plus a poll after the
		// crash, even while River still calls the dead dispatcher running.
		if ks, ok := o.kinds[d.kind]; ok {
			if _, err := o.recoverExpired(ctx, ks); err != nil {
				return woken, err
			}
		}
		err := pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
			res, err := client.InsertTx(ctx, tx, dispatchArgs{OperationKind: d.kind}, nil)
			if err != nil {
				return err
			}
			// A takeover is named after the dead job it replaces. If that takeover was
			// killed too, its own "running" job swallows the same insert: follow the chain
			// and name the next takeover after the newest dead job, or the kind would stay
			// without a dispatcher until River's one-hour rescue (seen in the chaos suite:
			// 27,709 payouts left PENDING after a takeover dispatcher was killed).
			for hop := 0; hop < 100 && res.UniqueSkippedAsDuplicate && res.Job.State == rivertype.JobStateRunning && !d.alive; hop++ {
				res, err = client.InsertTx(ctx, tx, dispatchArgs{OperationKind: d.kind, Takeover: res.Job.ID}, nil)
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return woken, fmt.Errorf("waking the dispatcher of kind %q: %w", d.kind, err)
		}
		woken = append(woken, d.kind)
	}
	return woken, nil
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
