package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// Queues of the settle section's River clients: one client per variant, so that each
// variant's fetch settings are its own.
const (
	queueStepwise   = "bench_stepwise"
	queueRiverSlow  = "bench_river_default"
	queueRiverFast  = "bench_river_fast"
	riverFastCooldn = 5 * time.Millisecond
)

// measurement is one timed run of a variant.
type measurement struct {
	items int
	// elapsed is the timed window: for the floor from the claim to the last commit; for
	// Stepwise from before workflow.Start to the return of the Work that committed the last
	// step (River's pickup, the claim and the run's bookkeeping included); for River from
	// the jobs' insert commit to the last job's commit.
	elapsed time.Duration
	// pickup is, for Stepwise, the time from workflow.Start's commit to the first Work
	// call: River's fetch latency, once per run. Shown beside the rate; elapsed includes it.
	pickup time.Duration
	// db is the database server's CPU time over the run, where the bench can read it (see
	// dbcpu.go; negative: not measured). Only the runs a section reports it for set it.
	db time.Duration
	// proc is this process's CPU time over the run (user + system: the variant's Go code,
	// River's clients, pgx, GC), where a section reports it; zero: not measured. Every
	// variant's window holds the idle background of the River clients this process runs (the
	// floor's too), and Stepwise's its last status read after the run. On a machine whose
	// cores the database already keeps busy, what the process spends beyond the floor comes
	// out of the database's share, so the ratio pays for it too.
	proc time.Duration
}

func (m measurement) rate() float64 { return float64(m.items) / m.elapsed.Seconds() }

// settleRig is the settle section's database and River clients.
type settleRig struct {
	pool  *pgxpool.Pool
	log   *slog.Logger
	dates *dateSeq

	engine   *workflow.Engine
	stepwise *river.Client[pgx.Tx]
	worker   *cappedSettle
	timing   *workTiming

	perMerchant map[string]*perMerchantRig
}

// dateSeq hands out fresh business dates: every run settles a date nobody settled, with
// identical transactions, while the settlements of earlier runs stay (steady state).
type dateSeq struct {
	mu   sync.Mutex
	next time.Time
}

func newDateSeq() *dateSeq { return &dateSeq{next: firstDate} }

func (d *dateSeq) take() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.next
	d.next = d.next.AddDate(0, 0, 1)
	return t
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// createFloorTable creates the cursor table of the hand-written loop. The template has it,
// so every section's database does.
func createFloorTable(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_floor_cursor (
		key text PRIMARY KEY, token bigint NOT NULL, cursor bigint NOT NULL,
		steps bigint NOT NULL DEFAULT 0, lease_until timestamptz)`); err != nil {
		return fmt.Errorf("creating the floor's cursor table: %w", err)
	}
	return nil
}

// newSettleRig starts the River client of the Stepwise variant and, with riverWorkers > 0,
// those of the one-job-per-merchant variant.
func newSettleRig(ctx context.Context, pool *pgxpool.Pool, riverWorkers int, log *slog.Logger) (*settleRig, error) {
	r := &settleRig{pool: pool, log: log, dates: newDateSeq(), timing: newWorkTiming(), perMerchant: map[string]*perMerchantRig{}}
	var err error
	r.engine, err = workflow.New(pool, &workflow.Config{Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	r.worker = &cappedSettle{}
	workflow.AddWorker(r.engine, workers, r.worker)
	// The settle step's Enqueue has the payout dispatcher woken after each commit (by the
	// client's waker, part of what Stepwise costs), so the client must know the dispatcher's
	// kind and carry the waker's middleware. Its queue is left out: delivery would compete for the same two cores, and is
	// measured on its own in the delivery section.
	ob, err := outbox.New(pool, &outbox.Config{Logger: quietLogger(), Kinds: map[string]*outbox.KindConfig{
		settlement.PayoutKind: {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			return outbox.Receipt{}, outbox.NotSent(errors.New("the settle section delivers nothing"))
		})},
	}})
	if err != nil {
		return nil, err
	}
	if err := ob.Register(ctx); err != nil {
		return nil, err
	}
	rc := &river.Config{
		ID: fmt.Sprintf("bench-stepwise-%d", time.Now().UnixNano()),
		// One worker per run of the concurrent part (one run at a time elsewhere).
		Queues:     map[string]river.QueueConfig{queueStepwise: {MaxWorkers: concurrentRuns}},
		Workers:    workers,
		Middleware: []rivertype.Middleware{r.timing},
		Logger:     quietLogger(),
	}
	if err := r.engine.Install(rc); err != nil {
		return nil, err
	}
	// The dispatcher's worker and the waker's middleware, without the kind's queue or poll.
	if err := ob.InstallWithoutDelivery(rc); err != nil {
		return nil, err
	}
	r.stepwise, err = river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return nil, fmt.Errorf("creating the Stepwise River client: %w", err)
	}
	if err := r.stepwise.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting the Stepwise River client: %w", err)
	}
	for _, s := range []struct {
		queue    string
		cooldown time.Duration
	}{{queueRiverSlow, 0}, {queueRiverFast, riverFastCooldn}} {
		if riverWorkers == 0 {
			break
		}
		pm, err := newPerMerchantRig(ctx, pool, s.queue, s.cooldown, riverWorkers)
		if err != nil {
			r.close()
			return nil, err
		}
		r.perMerchant[s.queue] = pm
	}
	return r, nil
}

func (r *settleRig) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.stepwise != nil {
		_ = r.stepwise.Stop(ctx)
	}
	for _, pm := range r.perMerchant {
		_ = pm.client.Stop(ctx)
	}
}

// newDate seeds the transactions of a fresh date for merchants 1..items.
func (r *settleRig) newDate(ctx context.Context, items int) (time.Time, error) {
	d := r.dates.take()
	return d, seedDate(ctx, r.pool, d, items)
}

// verify checks that a run settled exactly merchants 1..items of date: a bench that counted
// work it did not do would be worse than none.
func (r *settleRig) verify(ctx context.Context, date time.Time, items int) error {
	var settlements, entries, payouts int
	err := r.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM settlement WHERE settle_date = $1),
		(SELECT count(*) FROM ledger_entry l JOIN settlement s ON s.id = l.settlement_id WHERE s.settle_date = $1),
		(SELECT count(*) FROM stepwise_operation WHERE kind = $2 AND business_key LIKE $3 || '/%')`,
		date, settlement.PayoutKind, date.Format(time.DateOnly)).Scan(&settlements, &entries, &payouts)
	if err != nil {
		return fmt.Errorf("verifying the run of %s: %w", date.Format(time.DateOnly), err)
	}
	if settlements != items || entries != 2*items || payouts != items {
		return fmt.Errorf("run of %s settled %d merchants with %d ledger entries and %d payouts; want %d, %d, %d",
			date.Format(time.DateOnly), settlements, entries, payouts, items, 2*items, items)
	}
	return nil
}

// floor is variant (a): the settle loop written by hand in pgx, as a careful team writes it
// without an SDK: one claim, then per batch one transaction (pgx.BeginFunc on the pool, as the
// sample's own plain-pgx test does) holding SettleBatch (the sample's statement and its
// payouts) and a fenced cursor UPDATE.
func (r *settleRig) floor(ctx context.Context, date time.Time, batch, items int) (measurement, error) {
	return floorRun(ctx, r.pool, date, batch, items)
}

// floorRun is the floor's loop on pool. Outside a River worker its payouts wake no dispatcher:
// they are PENDING for whoever delivers them (the delivery and reconcile sections use it to
// make payouts).
func floorRun(ctx context.Context, pool *pgxpool.Pool, date time.Time, batch, items int) (measurement, error) {
	return floorShard(ctx, pool, date, 0, 1, batch, items)
}

// floorKinds is the floor's Local: the kinds it found registered, and no River client, so its
// payouts wake nothing.
var floorKinds = outbox.NewLocal()

// floorShard is the floor's loop over one shard of the date's merchants (the concurrent
// part runs one per shard at once).
func floorShard(ctx context.Context, pool *pgxpool.Pool, date time.Time, shard, shards, batch, items int) (measurement, error) {
	// A careful loop checks its payout kind once, as a Stepwise client does (its Local keeps
	// the kinds found). Without a Local in ctx, Enqueue reads the kind registry on every call:
	// until this was found, the floor paid that statement in every step and Stepwise did not
	// (148 µs a step at B=100 in the trace, about 3% of the step), and every ratio read high by as much.
	ctx = floorKinds.Context(ctx, nil)
	key := floorShardKey(date, shard, shards)
	start := time.Now()
	var token int64
	if err := pool.QueryRow(ctx, `
		INSERT INTO bench_floor_cursor (key, token, cursor, lease_until) VALUES ($1, 1, 0, now() + interval '30 seconds')
		ON CONFLICT (key) DO UPDATE SET token = bench_floor_cursor.token + 1, lease_until = excluded.lease_until
		RETURNING token`, key).Scan(&token); err != nil {
		return measurement{}, fmt.Errorf("floor: claiming: %w", err)
	}
	var after int64
	for {
		var res settlement.BatchResult
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			res, err = settlement.SettleBatch(ctx, tx, settlement.Batch{
				Date: date, Shard: shard, Shards: shards, AfterMerchant: after, Size: batch, RunKey: key,
			})
			if err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `UPDATE bench_floor_cursor SET cursor = $3, steps = steps + 1, lease_until = now() + interval '30 seconds'
				WHERE key = $1 AND token = $2`, key, token, res.LastMerchant)
			if err == nil && tag.RowsAffected() != 1 {
				err = errors.New("fenced: the cursor row has a newer token")
			}
			return err
		})
		if err != nil {
			return measurement{}, fmt.Errorf("floor: step after merchant %d: %w", after, err)
		}
		after = res.LastMerchant
		if res.Done || after >= int64(items) {
			break
		}
	}
	// Merchant ids are dense and the date has transactions for the first items of them: a
	// last batch that ran past them covered merchants with nothing to settle, as
	// SettleWorker's does in the Stepwise variant.
	return measurement{items: int(min(after, int64(items))), elapsed: time.Since(start)}, nil
}

// cappedSettle is settlement.SettleWorker, the sample's own step, ending the run once the
// cursor reaches cap merchants (runs at B=1 settle a prefix of the merchants). Batch and cap
// are set before each run; runs do not overlap.
type cappedSettle struct {
	workflow.StepperDefaults[settlement.SettleArgs, settlement.SettleCursor]
	batch atomic.Int64
	cap   atomic.Int64

	// starts records when each step began, when recording is on (the size section): the
	// interval between two starts is one whole step, commit and next BEGIN included.
	mu        sync.Mutex
	recording bool
	starts    []time.Time
}

// record switches step-start recording on (clearing what was recorded) or off, returning
// what was recorded.
func (w *cappedSettle) record(on bool) []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.starts
	w.recording, w.starts = on, nil
	return out
}

func (w *cappedSettle) Step(ctx context.Context, s *workflow.Step[settlement.SettleArgs, settlement.SettleCursor]) (workflow.Next, error) {
	w.mu.Lock()
	if w.recording {
		w.starts = append(w.starts, time.Now())
	}
	w.mu.Unlock()
	inner := settlement.SettleWorker{BatchSize: int(w.batch.Load())}
	next, err := inner.Step(ctx, s)
	if err == nil && s.Cursor.AfterMerchant >= w.cap.Load() {
		return workflow.Done(), nil
	}
	return next, err
}

// workTiming is River worker middleware that records when each job's Work started and
// returned. For a Stepwise run, Work returns after the last step's commit (which completed
// the River job in the same transaction), so its return is when the run's work is durable.
type workTiming struct {
	river.MiddlewareDefaults
	mu    sync.Mutex
	byJob map[int64]*workSpan
	ended chan int64
}

type workSpan struct {
	start, end time.Time
	err        error
}

func newWorkTiming() *workTiming {
	return &workTiming{byJob: map[int64]*workSpan{}, ended: make(chan int64, 1024)}
}

func (t *workTiming) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job.Kind != (settlement.SettleArgs{}).Kind() {
		return doInner(ctx)
	}
	span := &workSpan{start: time.Now()}
	err := doInner(ctx)
	span.end, span.err = time.Now(), err
	t.mu.Lock()
	t.byJob[job.ID] = span
	t.mu.Unlock()
	select {
	case t.ended <- job.ID:
	default:
	}
	return err
}

func (t *workTiming) span(jobID int64) *workSpan {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byJob[jobID]
}

// stepwise is variant (b): settlement.SettleWorker as a Stepwise run, started with
// workflow.Start and worked by a River client.
func (r *settleRig) stepwiseRun(ctx context.Context, date time.Time, batch, items int, tag string) (measurement, error) {
	r.worker.batch.Store(int64(batch))
	r.worker.cap.Store(int64(items))
	key := fmt.Sprintf("settle/%s/%s", date.Format(time.DateOnly), tag)
	for len(r.timing.ended) > 0 {
		<-r.timing.ended
	}
	t0 := time.Now()
	run, err := workflow.Start(ctx, r.stepwise, key, settlement.SettleArgs{Date: date.Format(time.DateOnly), Shard: 0, Shards: 1},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: queueStepwise}})
	if err != nil {
		return measurement{}, err
	}
	committed := time.Now()
	var first, last time.Time
	deadline := time.After(runTimeout(items))
	for {
		select {
		case <-ctx.Done():
			return measurement{}, ctx.Err()
		case <-deadline:
			got, err := workflow.GetRun(ctx, r.pool, run.Key)
			if err != nil {
				return measurement{}, err
			}
			return measurement{}, fmt.Errorf("stepwise run %s did not finish in %s: it is %s (attempts %d, last error %q)",
				key, runTimeout(items), got.Status, got.Attempts, deref(got.LastError))
		case jobID := <-r.timing.ended:
			span := r.timing.span(jobID)
			if first.IsZero() || span.start.Before(first) {
				first = span.start
			}
			last = span.end
		}
		got, err := workflow.GetRun(ctx, r.pool, run.Key)
		if err != nil {
			return measurement{}, err
		}
		switch got.Status {
		case workflow.RunStatusSucceeded:
			var cursor int64
			if err := r.pool.QueryRow(ctx, `SELECT (cursor->>'after_merchant')::bigint FROM stepwise_checkpoint WHERE key = $1`, key).Scan(&cursor); err != nil {
				return measurement{}, fmt.Errorf("reading the cursor of %s: %w", key, err)
			}
			return measurement{items: int(min(cursor, int64(items))), elapsed: last.Sub(t0), pickup: first.Sub(committed)}, nil
		case workflow.RunStatusFailed, workflow.RunStatusCancelled:
			return measurement{}, fmt.Errorf("stepwise run %s ended %s: %s", key, got.Status, deref(got.LastError))
		}
	}
}

// runTimeout bounds a run of items merchants: generous (100 merchants/s), so that only a
// stuck run hits it.
func runTimeout(items int) time.Duration {
	return 30*time.Second + time.Duration(items)*10*time.Millisecond
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// perMerchantArgs is variant (c)'s job: settle one merchant.
type perMerchantArgs struct {
	Date     string `json:"date"`
	Merchant int64  `json:"merchant"`
}

func (perMerchantArgs) Kind() string { return "bench_settle_one" }

// perMerchantRig is a River client working one job per merchant.
type perMerchantRig struct {
	client *river.Client[pgx.Tx]
	worker *perMerchantWorker
	queue  string
}

func newPerMerchantRig(ctx context.Context, pool *pgxpool.Pool, queue string, cooldown time.Duration, maxWorkers int) (*perMerchantRig, error) {
	w := &perMerchantWorker{pool: pool}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:            fmt.Sprintf("bench-%s-%d", queue, time.Now().UnixNano()),
		Queues:        map[string]river.QueueConfig{queue: {MaxWorkers: maxWorkers}},
		Workers:       workers,
		FetchCooldown: cooldown, // 0: River's default (100ms)
		Logger:        quietLogger(),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the River client of %s: %w", queue, err)
	}
	if err := client.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting the River client of %s: %w", queue, err)
	}
	return &perMerchantRig{client: client, worker: w, queue: queue}, nil
}

// perMerchantWorker settles one merchant per job in its own transaction and completes the
// job in it (JobCompleteTx), the transactional way a River user writes it.
type perMerchantWorker struct {
	river.WorkerDefaults[perMerchantArgs]
	pool *pgxpool.Pool

	mu     sync.Mutex
	want   int64
	done   atomic.Int64
	doneAt time.Time
	signal chan struct{}
}

func (w *perMerchantWorker) arm(n int) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.want, w.doneAt, w.signal = int64(n), time.Time{}, make(chan struct{})
	w.done.Store(0)
	return w.signal
}

func (w *perMerchantWorker) Work(ctx context.Context, job *river.Job[perMerchantArgs]) error {
	date, err := settlement.ParseDate(job.Args.Date)
	if err != nil {
		return river.JobCancel(err)
	}
	// SettleBatch runs on a context without River's client: a River user without Stepwise
	// has no dispatcher to wake, and the bench must not charge them for ours.
	plain, cancel := context.WithCancel(context.Background())
	defer context.AfterFunc(ctx, cancel)()
	defer cancel()
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := settlement.SettleBatch(plain, tx, settlement.Batch{
		Date: date, Shard: 0, Shards: 1, AfterMerchant: job.Args.Merchant - 1, Size: 1, RunKey: "river/" + job.Args.Date,
	}); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if w.done.Add(1) == w.want {
		w.mu.Lock()
		w.doneAt = time.Now()
		close(w.signal)
		w.mu.Unlock()
	}
	return nil
}

// riverRun is variant (c): insert one job per merchant (not timed), then time from the
// insert's commit to the last job's commit.
func (r *settleRig) riverRun(ctx context.Context, queue string, date time.Time, items int) (measurement, error) {
	pm := r.perMerchant[queue]
	signal := pm.worker.arm(items)
	params := make([]river.InsertManyParams, items)
	for i := range params {
		params[i] = river.InsertManyParams{
			Args:       perMerchantArgs{Date: date.Format(time.DateOnly), Merchant: int64(i + 1)},
			InsertOpts: &river.InsertOpts{Queue: queue},
		}
	}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return measurement{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := pm.client.InsertManyTx(ctx, tx, params); err != nil {
		return measurement{}, fmt.Errorf("inserting %d jobs: %w", items, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return measurement{}, err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return measurement{}, ctx.Err()
	case <-time.After(runTimeout(items)):
		return measurement{}, fmt.Errorf("river run of %d jobs did not finish in %s (%d done)", items, runTimeout(items), pm.worker.done.Load())
	case <-signal:
	}
	pm.worker.mu.Lock()
	d := pm.worker.doneAt.Sub(start)
	pm.worker.mu.Unlock()
	return measurement{items: items, elapsed: d}, nil
}
