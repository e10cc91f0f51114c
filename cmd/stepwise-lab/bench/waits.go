package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/workflow"
)

// The waits section: what runs that wait (workflow.WaitForSignal) cost while they wait, and
// how soon a signal's commit starts the run's next step.
const (
	queueWaits   = "bench_waits"
	waitsSignal  = "go"
	waitsTimeout = 24 * time.Hour // the waits never time out during the bench
	// waitsSpacing is the least time between two signals of the spaced wakes: more than the
	// worker's FetchCooldown (River's default, 100ms), the least time between two fetches,
	// so that each spaced wake meets an idle worker: its latency is the notified path alone.
	// The burst shows the other case.
	waitsSpacing = 150 * time.Millisecond
	// maintenanceJobKind is the River kind of Stepwise's maintenance job (its args type is
	// unexported: users never insert it). TestReadmeBenchCommand's bench --quick fails here
	// if it changes, since the start's pass is then never seen.
	maintenanceJobKind = "stepwise_maintenance"
)

// waitsArgs is the bench's waiting workflow: its first step waits for the signal "go", the
// step after the wait records when it began and ends the run.
type waitsArgs struct{}

func (waitsArgs) Kind() string { return "bench_wait" }

func (waitsArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: queueWaits} }

type waitsCursor struct{}

// waitsWorker is the waiting workflow's step. The step after a wait records, once per run,
// when it began (before its own statements): the end of the wake latency.
type waitsWorker struct {
	workflow.StepperDefaults[waitsArgs, waitsCursor]

	mu     sync.Mutex
	woke   map[string]time.Time
	notify chan struct{} // one pending notice that woke changed
}

func newWaitsWorker() *waitsWorker {
	return &waitsWorker{woke: map[string]time.Time{}, notify: make(chan struct{}, 1)}
}

func (w *waitsWorker) Step(_ context.Context, s *workflow.Step[waitsArgs, waitsCursor]) (workflow.Next, error) {
	if s.Woken() == nil {
		return workflow.WaitForSignal(waitsSignal, waitsTimeout), nil
	}
	began := time.Now()
	w.mu.Lock()
	if _, ok := w.woke[s.RunKey]; !ok { // a retried step keeps its first start
		w.woke[s.RunKey] = began
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
	return workflow.Done(), nil
}

// wokenAt waits until the step after key's wait began and returns when, or fails after within.
func (w *waitsWorker) wokenAt(ctx context.Context, key string, within time.Duration) (time.Time, error) {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		at, ok := w.woke[key]
		w.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-w.notify:
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("run %q: its step after the wait did not begin within %s of the signal", key, within)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// countTracer counts the statements a pool sends, by statement text, those of batches
// included (pgx traces a batch's statements apart from single queries). pg_stat_statements is
// not loaded on a default server; the counts are this process's, River's own included.
type countTracer struct {
	mu sync.Mutex
	n  map[string]int
}

func newCountTracer() *countTracer { return &countTracer{n: map[string]int{}} }

func (t *countTracer) add(sql string) {
	t.mu.Lock()
	t.n[sql]++
	t.mu.Unlock()
}

func (t *countTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.add(d.SQL)
	return ctx
}

func (t *countTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *countTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t *countTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.add(d.SQL)
}

func (t *countTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// reset returns the counts so far, by statement, and starts afresh.
func (t *countTracer) reset() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.n
	t.n = map[string]int{}
	return out
}

// stmtTally is a window's statements: all of them, and those naming a stepwise_ table
// (Stepwise's own; River's name only river_ tables).
type stmtTally struct{ all, stepwise int }

func tally(counts map[string]int) stmtTally {
	var t stmtTally
	for sql, n := range counts {
		t.all += n
		if strings.Contains(sql, "stepwise_") {
			t.stepwise += n
		}
	}
	return t
}

// waitsSection measures runs that wait for a signal. First, with --waits-runs runs (10,000)
// waiting as a step's WaitForSignal commit leaves them (run released, no lease, the timeout
// job scheduled a day out, the wait row), seeded set-based as BenchmarkMaintainPassWaiting
// seeds them: the median of Engine.Maintain passes (target <= 5 ms), the statements a pass
// sends beside a pass with no runs waiting, and the statements this process sends in an idle
// window (River's client running, no maintenance) beside the same window before the runs
// were seeded: a waiting run must cost nothing between passes. Then the wake latency: runs
// of the waiting workflow, worked by a River client in this process, each signalled
// (workflow.SignalPool) one at a time, timed from the signal's commit to the start of the
// run's next step; p50 and p99 over --waits-wakes runs (200).
func (r *runner) waitsSection(ctx context.Context) error {
	o := r.opts
	dbURL, err := r.clone(ctx, "waits")
	if err != nil {
		return err
	}
	tracer := newCountTracer()
	pool, err := newTracedPool(ctx, dbURL, o.poolConns, tracer)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Maintenance runs only where the bench calls it: the periodic job once an hour (and at
	// the client's start), so that the idle windows hold none.
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger(), MaintenanceInterval: time.Hour})
	if err != nil {
		return err
	}
	worker := newWaitsWorker()
	rc := &river.Config{
		ID: fmt.Sprintf("bench-waits-%d", time.Now().UnixNano()),
		// River's default fetch settings (FetchCooldown 100ms, FetchPollInterval 1s), as an
		// application's client has them.
		Queues:  map[string]river.QueueConfig{queueWaits: {MaxWorkers: 10}},
		Workers: river.NewWorkers(),
		Logger:  quietLogger(),
	}
	workflow.AddWorker(engine, rc.Workers, worker)
	if err := engine.Install(rc); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return fmt.Errorf("creating the River client: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := client.Start(runCtx); err != nil {
		return fmt.Errorf("starting the River client: %w", err)
	}
	defer func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
	}()

	passes, idle := 200, 5*time.Second
	if o.quick {
		passes, idle = 50, 1500*time.Millisecond
	}
	// timedPasses times n maintenance passes and counts their statements: the median count
	// over the passes is a pass's own (a River fetch that lands inside a pass adds one now
	// and then; the backstop's page of open waits, when it comes back to the start, takes one
	// fewer).
	timedPasses := func(n int) (times []time.Duration, stmts int, err error) {
		counts := make([]int, 0, n)
		for range n {
			tracer.reset()
			t := time.Now()
			if _, err := engine.Maintain(ctx, client); err != nil {
				return nil, 0, fmt.Errorf("maintenance pass: %w", err)
			}
			times = append(times, time.Since(t))
			counts = append(counts, tally(tracer.reset()).all)
		}
		slices.Sort(times)
		slices.Sort(counts)
		return times, counts[len(counts)/2], nil
	}
	idleWindow := func() map[string]int {
		tracer.reset()
		select {
		case <-time.After(idle):
		case <-ctx.Done():
		}
		return tracer.reset()
	}

	// The client's start settles first: River elects its leader, which runs the periodic
	// maintenance job once (RunOnStart); with that pass done, none comes for an hour.
	startPass := time.Now().Add(30 * time.Second)
	for {
		var done bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE kind = $1 AND state = 'completed')`,
			maintenanceJobKind).Scan(&done); err != nil {
			return fmt.Errorf("looking for the start's maintenance job: %w", err)
		}
		if done {
			break
		}
		if time.Now().After(startPass) {
			return errors.New("the River client's periodic maintenance job did not run within 30s of its start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, _, err := timedPasses(3); err != nil {
		return err
	}
	emptyTimes, emptyStmts, err := timedPasses(min(passes, 30))
	if err != nil {
		return err
	}
	emptyIdle := tally(idleWindow())
	r.progress("waits: with no runs waiting: pass median %s, %d statements a pass; idle %s: %d statements", fmtDur(emptyTimes[len(emptyTimes)/2]), emptyStmts, idle, emptyIdle.all)

	// Seeded in two parts: a tenth first, whose passes' statements are counted, then the
	// rest. A pass must send as many statements with all of them waiting as with a tenth:
	// nothing it does is per waiting run (the backstop checks one page of open waits a pass).
	n := o.waitsRuns
	few := max(n/10, 1)
	began := time.Now()
	if err := seedSignalWaits(ctx, pool, "waiting-a/", few); err != nil {
		return err
	}
	_, fewStmts, err := timedPasses(10)
	if err != nil {
		return err
	}
	if n > few {
		if err := seedSignalWaits(ctx, pool, "waiting-b/", n-few); err != nil {
			return err
		}
	}
	r.progress("waits: seeded %d runs waiting for a signal in %s", n, time.Since(began).Round(time.Millisecond))
	if _, _, err := timedPasses(3); err != nil {
		return err
	}
	times, stmts, err := timedPasses(passes)
	if err != nil {
		return err
	}
	idleCounts := idleWindow()
	busyIdle := tally(idleCounts)
	var stillWaiting int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_wait w JOIN stepwise_run r ON r.key = w.run_key
		WHERE w.run_key LIKE 'waiting-_/%' AND w.woken_at IS NULL AND r.status = 'running'`).Scan(&stillWaiting); err != nil {
		return fmt.Errorf("counting the waiting runs: %w", err)
	}
	if stillWaiting != n {
		return fmt.Errorf("after the passes %d of the %d seeded runs still wait; want all (maintenance must leave a wait alone)", stillWaiting, n)
	}
	median, p95 := times[len(times)/2], times[len(times)*95/100]
	perSec := func(c int) float64 { return float64(c) / idle.Seconds() }

	r.printf("\n== waits: runs waiting for a signal (WaitForSignal, timeout a day out, no lease), and signal wake latency ==\n")
	r.printf("maintenance pass with %s runs waiting: median %s, p95 %s, max %s over %d passes (with none waiting: median %s)\n",
		groupThousands(int64(n)), fmtDur(median), fmtDur(p95), fmtDur(times[len(times)-1]), passes, fmtDur(emptyTimes[len(emptyTimes)/2]))
	r.check(median <= 5*time.Millisecond, "maintenance pass <= 5ms with %s runs waiting: median %s", groupThousands(int64(n)), fmtDur(median))
	r.printf("statements a pass (pgx tracer on this process's pool, BEGIN/COMMIT and batches included; median over the passes): %d with %s waiting, %d with %s, %d with none\n",
		stmts, groupThousands(int64(n)), fewStmts, groupThousands(int64(few)), emptyStmts)
	r.check(stmts <= fewStmts, "a maintenance pass's statements do not grow with waiting runs: %d with %s waiting, %d with %s", stmts, groupThousands(int64(n)), fewStmts, groupThousands(int64(few)))
	r.printf("idle %s with no maintenance pass (River's client running, same tracer): %.1f statements/s with %s waiting (%d naming a stepwise_ table), %.1f/s with none (%d naming a stepwise_ table)\n",
		idle, perSec(busyIdle.all), groupThousands(int64(n)), busyIdle.stepwise, perSec(emptyIdle.all), emptyIdle.stepwise)
	if busyIdle.all > 0 {
		r.printf("  what ran in the idle window with runs waiting: %s\n", topStatements(idleCounts, 4))
	}
	r.check(busyIdle.stepwise == 0, "waiting runs add no statements between maintenance passes: %d Stepwise statements in %s idle with %s waiting (all statements %.1f/s, %.1f/s with none)",
		busyIdle.stepwise, idle, groupThousands(int64(n)), perSec(busyIdle.all), perSec(emptyIdle.all))

	return r.wakeLatency(ctx, pool, client, worker)
}

// wakeLatency measures how soon a signal's commit starts the run's next step, in this
// process's River worker, over runs of the waiting workflow started together and each waiting
// for its signal. Spaced: the --waits-wakes runs are signalled one at a time, each signal
// waitsSpacing after the one before, as signals that arrive apart do. A burst: waitsBurst more
// are signalled back to back, as fast as SignalPool commits. The latency is from SignalPool's
// return (the signal's commit) to the start of the step after the wait.
func (r *runner) wakeLatency(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], worker *waitsWorker) error {
	n, burst := r.opts.waitsWakes, 50
	if r.opts.quick {
		burst = 20
	}
	keys := make([]string, n+burst)
	for i := range keys {
		keys[i] = fmt.Sprintf("wake/%d", i)
		if i >= n {
			keys[i] = fmt.Sprintf("wake/burst-%d", i-n)
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, k := range keys {
			if _, err := workflow.StartTx(ctx, client, tx, k, waitsArgs{}, nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("starting the runs to wake: %w", err)
	}
	waitUntil := time.Now().Add(60 * time.Second)
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_wait WHERE run_key LIKE 'wake/%' AND woken_at IS NULL`).Scan(&waiting); err != nil {
			return fmt.Errorf("counting the runs that wait: %w", err)
		}
		if waiting == len(keys) {
			break
		}
		if time.Now().After(waitUntil) {
			return fmt.Errorf("%d of %d runs wait for their signal after 60s", waiting, len(keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.progress("waits: %d runs wait for their signal; waking %d of them %s apart, then %d back to back", len(keys), n, waitsSpacing, burst)

	signal := func(k string) (sent, committed time.Time, err error) {
		sent = time.Now()
		err = workflow.SignalPool(ctx, pool, k, waitsSignal, "bench", nil)
		return sent, time.Now(), err
	}
	lat := make([]time.Duration, 0, n)
	sends := make([]time.Duration, 0, n)
	for i, k := range keys[:n] {
		sent, committed, err := signal(k)
		if err != nil {
			return err
		}
		at, err := worker.wokenAt(ctx, k, 10*time.Second)
		if err != nil {
			return err
		}
		sends = append(sends, committed.Sub(sent))
		lat = append(lat, at.Sub(committed))
		if (i+1)%100 == 0 && i+1 < n {
			r.progress("waits: woke %d/%d runs", i+1, n)
		}
		time.Sleep(time.Until(sent.Add(waitsSpacing)))
	}
	burstLat := make([]time.Duration, 0, burst)
	committedAt := make([]time.Time, burst)
	for i, k := range keys[n:] {
		_, committed, err := signal(k)
		if err != nil {
			return err
		}
		committedAt[i] = committed
	}
	for i, k := range keys[n:] {
		at, err := worker.wokenAt(ctx, k, 10*time.Second)
		if err != nil {
			return err
		}
		burstLat = append(burstLat, at.Sub(committedAt[i]))
	}
	burstSpan := committedAt[burst-1].Sub(committedAt[0])
	// Every run woken must finish: a bench that timed wakes of runs that then failed would
	// measure nothing.
	doneBy := time.Now().Add(30 * time.Second)
	for {
		var succeeded int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_run WHERE key LIKE 'wake/%' AND status = 'succeeded'`).Scan(&succeeded); err != nil {
			return fmt.Errorf("counting the woken runs that finished: %w", err)
		}
		if succeeded == len(keys) {
			break
		}
		if time.Now().After(doneBy) {
			return fmt.Errorf("%d of %d woken runs succeeded after 30s", succeeded, len(keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(lat)
	slices.Sort(sends)
	slices.Sort(burstLat)
	p := func(ds []time.Duration, q float64) time.Duration { return ds[min(len(ds)-1, int(float64(len(ds))*q))] }
	r.printf("wake latency, signal commit (SignalPool returned) to the start of the run's next step in this process's River worker (River's default fetch settings):\n")
	r.printf("  %d signals %s apart: p50 %s, p99 %s, max %s (the signal's own transaction: p50 %s)\n",
		n, waitsSpacing, fmtDur(p(lat, 0.5)), fmtDur(p(lat, 0.99)), fmtDur(lat[len(lat)-1]), fmtDur(p(sends, 0.5)))
	r.printf("  %d signals back to back (committed within %s): p50 %s, p99 %s, max %s; every wake is announced, and a worker fetches at most once per FetchCooldown (100ms by default), so a wake soon after another waits for the next fetch\n",
		burst, fmtDur(burstSpan), fmtDur(p(burstLat, 0.5)), fmtDur(p(burstLat, 0.99)), fmtDur(burstLat[len(burstLat)-1]))
	return nil
}

// seedSignalWaits writes n runs under prefix waiting for the signal "go" as a step's
// WaitForSignal commit leaves them: the run 'running' and released, its checkpoint holding no
// lease, its timeout job scheduled a day out, the wait row. Set-based, then analyzed.
func seedSignalWaits(ctx context.Context, pool *pgxpool.Pool, prefix string, n int) error {
	if _, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) SELECT $1 || g FROM generate_series(1, $2::int) g`, prefix, n); err != nil {
		return fmt.Errorf("seeding waiting runs' checkpoints: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, priority, metadata, scheduled_at)
		SELECT '{}', $3, 25, $4, 'scheduled', 1, jsonb_build_object('stepwise_run', $1 || g), now() + interval '1 day'
		  FROM generate_series(1, $2::int) g`, prefix, n, waitsArgs{}.Kind(), queueWaits); err != nil {
		return fmt.Errorf("seeding waiting runs' timeout jobs: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, river_job_id, status, released_at, wake_at)
		SELECT metadata->>'stepwise_run', kind, args, id, 'running', now(), scheduled_at
		  FROM river_job WHERE kind = $2 AND metadata->>'stepwise_run' LIKE $1 || '%'`, prefix, waitsArgs{}.Kind()); err != nil {
		return fmt.Errorf("seeding waiting runs: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO stepwise_wait (run_key, kind, signal_name, deadline)
		SELECT $1 || g, 'signal', $3, now() + interval '1 day' FROM generate_series(1, $2::int) g`, prefix, n, waitsSignal); err != nil {
		return fmt.Errorf("seeding waiting runs' waits: %w", err)
	}
	for _, table := range []string{"stepwise_checkpoint", "stepwise_run", "river_job", "stepwise_wait"} {
		if _, err := pool.Exec(ctx, "ANALYZE "+table); err != nil {
			return err
		}
	}
	return nil
}

// topStatements lists the k statements run most often, with their counts.
func topStatements(counts map[string]int, k int) string {
	type row struct {
		label string
		n     int
	}
	var rows []row
	for sql, n := range counts {
		rows = append(rows, row{statementLabel(sql), n})
	}
	sort.Slice(rows, func(i, j int) bool {
		return rows[i].n > rows[j].n || rows[i].n == rows[j].n && rows[i].label < rows[j].label
	})
	var parts []string
	for i, rw := range rows {
		if i == k {
			parts = append(parts, fmt.Sprintf("%d more", len(rows)-k))
			break
		}
		parts = append(parts, fmt.Sprintf("%d× %s", rw.n, rw.label))
	}
	return strings.Join(parts, "; ")
}
