package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// The concurrent part of the settle section: one business date split into concurrentRuns
// shards, settled by that many Stepwise runs at once in this process, next to as many
// hand-written loops at once on identical data, and next to one Stepwise run settling the
// whole date. It shows whether concurrent runs scale or queue on something they share (issue
// 16: they used to queue on the payout dispatcher's wake row).
const (
	concurrentRuns  = 8
	concurrentBatch = 100
)

// concurrentVariants are the variants of one round.
var concurrentVariants = []string{"floor8", "stepwise8", "stepwise1"}

// concurrentOrders are the rounds' orders, in turn. floor8 and stepwise8 always run back to
// back (the headline ratio is theirs: a pair apart by a third run met different loads), each
// first in half the rounds, with stepwise1 before or after the pair.
var concurrentOrders = [][]string{
	{"floor8", "stepwise8", "stepwise1"},
	{"stepwise1", "stepwise8", "floor8"},
	{"stepwise8", "floor8", "stepwise1"},
	{"stepwise1", "floor8", "stepwise8"},
}

// concurrentResult is what the concurrent rounds measured.
type concurrentResult struct {
	best         map[string]float64 // best items/s of each variant
	runs         map[string][]measurement
	vsFloor      []float64 // per round: stepwise8 / floor8
	vsSingle     []float64 // per round: stepwise8 / stepwise1
	items, round int
}

// concurrentRounds runs o.rounds rounds of the three variants, the order changing from round
// to round (concurrentOrders) so that each meets the machine's load drift in every position.
func (r *runner) concurrentRounds(ctx context.Context, rig *settleRig) (*concurrentResult, error) {
	o := r.opts
	items := o.merchants
	res := &concurrentResult{best: map[string]float64{}, runs: map[string][]measurement{}, items: items}
	// Warm-up: one of each, not counted.
	for _, v := range concurrentVariants {
		if _, err := r.concurrentRun(ctx, rig, v, items, "warmup"); err != nil {
			return nil, err
		}
	}
	for round := range o.rounds {
		order := concurrentOrders[round%len(concurrentOrders)]
		got := map[string]float64{}
		for _, v := range order {
			m, err := r.concurrentRun(ctx, rig, v, items, fmt.Sprintf("r%d", round))
			if err != nil {
				return nil, err
			}
			got[v] = m.rate()
			res.runs[v] = append(res.runs[v], m)
			res.best[v] = max(res.best[v], m.rate())
		}
		res.vsFloor = append(res.vsFloor, got["stepwise8"]/got["floor8"])
		res.vsSingle = append(res.vsSingle, got["stepwise8"]/got["stepwise1"])
		res.round = round + 1
		r.progress("settle: concurrent round %d/%d: %d loops %s/s, %d runs %s/s, 1 run %s/s (8 runs/8 loops %.2f, 8 runs/1 run %.2f)",
			round+1, o.rounds, concurrentRuns, fmtRate(got["floor8"]), concurrentRuns, fmtRate(got["stepwise8"]), fmtRate(got["stepwise1"]),
			got["stepwise8"]/got["floor8"], got["stepwise8"]/got["stepwise1"])
	}
	return res, nil
}

// concurrentRun settles a fresh date of items merchants with variant v and verifies it.
func (r *runner) concurrentRun(ctx context.Context, rig *settleRig, v string, items int, tag string) (measurement, error) {
	date, err := rig.newDate(ctx, items)
	if err != nil {
		return measurement{}, err
	}
	var m measurement
	db, proc := r.dbCPU(), cpuTime()
	switch v {
	case "floor8":
		m, err = floorConcurrent(ctx, rig, date, concurrentBatch, items)
	case "stepwise8":
		m, err = rig.stepwiseShards(ctx, date, concurrentRuns, concurrentBatch, items, "c8-"+tag)
	case "stepwise1":
		m, err = rig.stepwiseShards(ctx, date, 1, concurrentBatch, items, "c1-"+tag)
	}
	if err != nil {
		return measurement{}, fmt.Errorf("concurrent %s: %w", v, err)
	}
	// The process first: reading the server's CPU from /proc costs this process some.
	m.proc = cpuTime() - proc
	m.db = db.used()
	if err := rig.verify(ctx, date, items); err != nil {
		return measurement{}, fmt.Errorf("concurrent %s: %w", v, err)
	}
	r.log.Info("concurrent", "variant", v, "items", m.items, "per_s", int(m.rate()))
	return m, nil
}

// floorConcurrent runs concurrentRuns hand-written loops at once, one per shard of the date,
// each on its own connection of the pool, timed from before the first claim to the last
// commit.
func floorConcurrent(ctx context.Context, rig *settleRig, date time.Time, batch, items int) (measurement, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, concurrentRuns)
	for shard := range concurrentRuns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[shard] = floorShard(ctx, rig.pool, date, shard, concurrentRuns, batch, items)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return measurement{}, err
		}
	}
	return measurement{items: items, elapsed: elapsed}, nil
}

// stepwiseShards starts shards Stepwise runs of the date at once (one per shard) and times
// them from before the first workflow.Start to the return of the last Work that committed a
// run's last step.
func (r *settleRig) stepwiseShards(ctx context.Context, date time.Time, shards, batch, items int, tag string) (measurement, error) {
	r.worker.batch.Store(int64(batch))
	r.worker.cap.Store(int64(items))
	keys := make([]string, shards)
	jobs := make([]int64, 0, shards)
	for len(r.timing.ended) > 0 {
		<-r.timing.ended
	}
	t0 := time.Now()
	// The shards of a date start together, in one transaction, as the sample's service
	// starts them: River fetches them together instead of one fetch cooldown apart.
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		for shard := range shards {
			keys[shard] = fmt.Sprintf("settle/%s/%s/%d-of-%d", date.Format(time.DateOnly), tag, shard, shards)
			run, err := workflow.StartTx(ctx, r.stepwise, tx, keys[shard],
				settlement.SettleArgs{Date: date.Format(time.DateOnly), Shard: shard, Shards: shards},
				&workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: queueStepwise}})
			if err != nil {
				return err
			}
			if run.RiverJobID == nil {
				return fmt.Errorf("run %s was started without a River job", keys[shard])
			}
			jobs = append(jobs, *run.RiverJobID)
		}
		return nil
	})
	if err != nil {
		return measurement{}, err
	}
	started := time.Since(t0)
	// Wait for the runs' Works to return, as the middleware reports them, not by polling the
	// database: a query every few milliseconds during the measurement was load the floor's
	// loops never met (about 140 statements in a 0.7 s measurement, on the same two cores).
	// The database is asked only when every run's last Work has returned, and every
	// statusCheck otherwise, so that a failed run ends the wait.
	const statusCheck = 250 * time.Millisecond
	deadline := time.Now().Add(runTimeout(items))
	check := time.NewTicker(statusCheck)
	defer check.Stop()
	for {
		if r.timing.allEnded(jobs, t0) {
			// A run is "succeeded" before its Work returns, so the last return is when the
			// date was durably settled; confirm that every run did succeed.
			done, failed, err := r.shardStatus(ctx, keys)
			if err != nil {
				return measurement{}, err
			}
			if failed > 0 || done != shards {
				return measurement{}, fmt.Errorf("the Works of the %d runs of %s returned, but %d succeeded and %d failed",
					shards, date.Format(time.DateOnly), done, failed)
			}
			break
		}
		select {
		case <-ctx.Done():
			return measurement{}, ctx.Err()
		case <-r.timing.ended:
		case <-check.C:
			_, failed, err := r.shardStatus(ctx, keys)
			if err != nil {
				return measurement{}, err
			}
			if failed > 0 {
				return measurement{}, fmt.Errorf("%d of the %d runs of %s failed", failed, shards, date.Format(time.DateOnly))
			}
			if time.Now().After(deadline) {
				return measurement{}, fmt.Errorf("the runs of %s did not all finish in %s", date.Format(time.DateOnly), runTimeout(items))
			}
		}
	}
	firstStart, lastStart, firstEnd, last := r.timing.spansSince(t0)
	r.log.Info("concurrent runs", "runs", shards, "started", started, "first_pickup", firstStart.Sub(t0), "last_pickup", lastStart.Sub(t0),
		"first_done", firstEnd.Sub(t0), "last_done", last.Sub(t0))
	return measurement{items: items, elapsed: last.Sub(t0), pickup: firstStart.Sub(t0)}, nil
}

// shardStatus counts the runs of keys that succeeded and those that failed or were cancelled.
func (r *settleRig) shardStatus(ctx context.Context, keys []string) (done, failed int, err error) {
	err = r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = $2), count(*) FILTER (WHERE status IN ($3, $4))
		FROM stepwise_run WHERE key = ANY($1)`, keys, workflow.RunStatusSucceeded, workflow.RunStatusFailed, workflow.RunStatusCancelled).Scan(&done, &failed)
	return done, failed, err
}

// allEnded reports whether each of jobs has a Work that started after t0 and returned nil.
func (t *workTiming) allEnded(jobs []int64, t0 time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range jobs {
		s := t.byJob[id]
		if s == nil || !s.start.After(t0) || s.err != nil {
			return false
		}
	}
	return true
}

// spansSince reports, of the Works that started after t0, the first and last start and the
// first and last end.
func (t *workTiming) spansSince(t0 time.Time) (firstStart, lastStart, firstEnd, lastEnd time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.byJob {
		if !s.start.After(t0) {
			continue
		}
		if firstStart.IsZero() || s.start.Before(firstStart) {
			firstStart = s.start
		}
		if s.start.After(lastStart) {
			lastStart = s.start
		}
		if firstEnd.IsZero() || s.end.Before(firstEnd) {
			firstEnd = s.end
		}
		if s.end.After(lastEnd) {
			lastEnd = s.end
		}
	}
	return firstStart, lastStart, firstEnd, lastEnd
}

// floorShardKey is the floor's cursor row of a shard of a date.
func floorShardKey(date time.Time, shard, shards int) string {
	if shards == 1 {
		return "floor/" + date.Format(time.DateOnly)
	}
	return fmt.Sprintf("floor/%s/%d-of-%d", date.Format(time.DateOnly), shard, shards)
}
