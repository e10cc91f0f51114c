package workflowtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Worker is a worker process the chaos driver can kill, freeze and thaw. *Process is one;
// a command-line driver can wrap its own exec.Cmd.
type Worker interface {
	Pid() int
	Kill()
	Stop() error
	Cont() error
	Exited() bool
}

// ChaosConfig configures RunChaos.
type ChaosConfig struct {
	// Start starts one worker process. Required.
	Start func() (Worker, error)

	// Workers is how many worker processes run at once. Defaults to 3.
	Workers int

	// Seed makes the run reproducible: which worker is hit, and when. Defaults to a seed from
	// the clock; either way it is in the report, so a failing run can be repeated.
	Seed uint64

	// KillMin and KillMax bound the random pause between two hits. Default 500ms and 2s.
	KillMin, KillMax time.Duration

	// StopEvery makes every StopEvery-th hit a SIGSTOP (for StopFor, then SIGCONT) instead of
	// a SIGKILL, so frozen zombies wake up into a run someone else now owns. Defaults to 5;
	// -1 disables stops.
	StopEvery int

	// StopFor is how long a stopped worker stays frozen; make it longer than the lease, so a
	// worker frozen holding a lease is taken over and wakes a zombie. (A worker frozen
	// between fetching a job and claiming it holds no lease and is taken over only after two
	// leases: a shorter freeze just delays its run, as it would any River job.)
	// Defaults to 3s.
	StopFor time.Duration

	// Duration bounds the chaos phase. Defaults to 30s.
	Duration time.Duration

	// Until reports whether the system has reached quiet (all work done). Chaos stops
	// early when it does; after the chaos phase, RunChaos waits for it with every worker
	// alive. Required.
	Until func(ctx context.Context) (bool, error)

	// QuietTimeout bounds the wait for Until after the chaos phase. Defaults to 2 minutes.
	// With Progress set it bounds the wait without progress instead.
	QuietTimeout time.Duration

	// Progress, when set, returns a count of work done that grows while the system drains
	// (steps committed, operations settled, runs finished). The wait for quiet then fails
	// only after QuietTimeout passes with the count standing still, or after QuietMax in
	// all: a large backlog behind a slow external system drains slowly, and a fixed timeout
	// sized for a small one would call it a hang.
	Progress func(ctx context.Context) (int64, error)

	// QuietMax bounds the whole wait for quiet when Progress is set. Defaults to 10 times
	// QuietTimeout.
	QuietMax time.Duration

	// Logf receives one line per hit. Defaults to discarding.
	Logf func(format string, args ...any)

	// WorkerID names a started worker the way its lease owners begin (its River client
	// ID), so the report's Workers can be matched with the runs it held. Defaults to the
	// pid in decimal.
	WorkerID func(w Worker) string

	// Target picks the worker to hit from the IDs of the workers in slot order ("" for a
	// frozen or dead one, which cannot be hit), or returns -1 to let the seeded source pick. Defaults to always -1. The paused-dispatcher profile uses it to
	// freeze the process that holds claimed operations.
	Target func(ctx context.Context, ids []string) int

	// Fault, when set, replaces the killer: no worker is hit, and Fault runs once beside the
	// workers, breaking something else (the database server, the network), until it returns;
	// then RunChaos waits for quiet as usual. It returns the spans during which every worker
	// was cut off from the database (a server down), which are added to each worker's
	// CutOff, so that the takeovers they explain are not counted as needless. An error from
	// it ends RunChaos with that error.
	Fault func(ctx context.Context) (cutOff []Interval, err error)
}

// ChaosReport says what RunChaos did.
type ChaosReport struct {
	Seed     uint64
	Kills    int
	Stops    int
	Starts   int
	Elapsed  time.Duration
	Quiet    bool
	QuietErr error
	// Workers is the life of every worker process started, in start order: what the
	// takeover checks need (Liveness).
	Workers []WorkerLife
}

// Liveness returns what the run knows of its workers, for CheckOpts.Liveness.
func (r *ChaosReport) Liveness(window time.Duration, maxAttempts int) *Liveness {
	return &Liveness{Workers: append([]WorkerLife(nil), r.Workers...), Window: window, MaxAttempts: maxAttempts}
}

func (r *ChaosReport) String() string {
	return fmt.Sprintf("seed=%d kills=%d stops=%d starts=%d elapsed=%s quiet=%v",
		r.Seed, r.Kills, r.Stops, r.Starts, r.Elapsed.Round(time.Millisecond), r.Quiet)
}

// RunChaos runs cfg.Workers workers and, until cfg.Duration passes or cfg.Until holds, hits a
// random one every KillMin..KillMax: SIGKILL and restart, or every StopEvery-th time SIGSTOP
// for StopFor and SIGCONT. Then it restarts whatever is dead and waits for quiet. It returns
// an error only when the driver itself failed (a worker would not start); whether the
// system kept its invariants is for the caller to check afterwards (CheckInvariants).
func RunChaos(ctx context.Context, cfg *ChaosConfig) (*ChaosReport, error) {
	if cfg == nil || cfg.Start == nil || cfg.Until == nil {
		return nil, errors.New("workflowtest.RunChaos: Start and Until are required")
	}
	c := *cfg
	if c.Workers <= 0 {
		c.Workers = 3
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.KillMin <= 0 {
		c.KillMin = 500 * time.Millisecond
	}
	if c.KillMax < c.KillMin {
		c.KillMax = max(c.KillMin, 2*time.Second)
	}
	if c.StopEvery == 0 {
		c.StopEvery = 5
	}
	if c.StopFor <= 0 {
		c.StopFor = 3 * time.Second
	}
	if c.Duration <= 0 {
		c.Duration = 30 * time.Second
	}
	if c.QuietTimeout <= 0 {
		c.QuietTimeout = 2 * time.Minute
	}
	if c.QuietMax <= 0 {
		c.QuietMax = 10 * c.QuietTimeout
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	if c.WorkerID == nil {
		c.WorkerID = func(w Worker) string { return fmt.Sprint(w.Pid()) }
	}
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0x5eed))
	report := &ChaosReport{Seed: c.Seed}
	began := time.Now()
	defer func() { report.Elapsed = time.Since(began) }()

	var (
		mu      sync.Mutex
		workers = make([]Worker, c.Workers)
		lives   = make([]int, c.Workers) // index into report.Workers of each slot's process
		frozen  = map[int]bool{}
		thawing sync.WaitGroup
	)
	defer thawing.Wait()
	// Lives are recorded under mu: the thawing goroutines close pause intervals.
	life := func(i int) *WorkerLife { return &report.Workers[lives[i]] }
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for i, w := range workers {
			if w != nil && w.Exited() && life(i).Died.IsZero() {
				life(i).Died = time.Now() // it died on its own; when exactly is not known
			}
		}
	}()
	start := func(i int) error {
		w, err := c.Start()
		if err != nil {
			return fmt.Errorf("starting worker %d: %w", i, err)
		}
		mu.Lock()
		workers[i] = w
		report.Workers = append(report.Workers, WorkerLife{ID: c.WorkerID(w), Pid: w.Pid(), Started: time.Now()})
		lives[i] = len(report.Workers) - 1
		report.Starts++
		mu.Unlock()
		return nil
	}
	for i := range workers {
		if err := start(i); err != nil {
			return report, err
		}
	}

	deadline := time.Now().Add(c.Duration)
	if c.Fault != nil {
		cutOff, err := c.Fault(ctx)
		mu.Lock()
		for i := range report.Workers {
			report.Workers[i].CutOff = append(report.Workers[i].CutOff, cutOff...)
		}
		mu.Unlock()
		if err != nil {
			return report, fmt.Errorf("workflowtest.RunChaos: the fault failed: %w", err)
		}
		deadline = time.Now() // no killer
	}
	hits := 0
	for time.Now().Before(deadline) {
		pause := c.KillMin + time.Duration(rng.Int64N(int64(c.KillMax-c.KillMin)+1))
		select {
		case <-ctx.Done():
			return report, ctx.Err()
		case <-time.After(pause):
		}
		if quiet, err := c.Until(ctx); err == nil && quiet {
			break
		}
		i := rng.IntN(len(workers))
		if c.Target != nil {
			mu.Lock()
			ids := make([]string, len(workers))
			for k := range workers {
				if !frozen[k] && !workers[k].Exited() {
					ids[k] = life(k).ID // frozen and dead workers are not candidates: ""
				}
			}
			mu.Unlock()
			if k := c.Target(ctx, ids); k >= 0 && k < len(workers) {
				i = k
			}
		}
		mu.Lock()
		w, isFrozen := workers[i], frozen[i]
		mu.Unlock()
		if isFrozen {
			continue
		}
		hits++
		if c.StopEvery > 0 && hits%c.StopEvery == 0 && !w.Exited() {
			stoppedAt := time.Now()
			if err := w.Stop(); err != nil {
				c.Logf("chaos: stop worker %d (pid %d): %v", i, w.Pid(), err)
				continue
			}
			report.Stops++
			c.Logf("chaos: SIGSTOP worker %d (pid %d) for %s", i, w.Pid(), c.StopFor)
			mu.Lock()
			frozen[i] = true
			l := lives[i] // an index: report.Workers grows, so pointers into it go stale
			report.Workers[l].Paused = append(report.Workers[l].Paused, Interval{From: stoppedAt})
			mu.Unlock()
			thawing.Add(1)
			go func(i int, w Worker, l int) {
				defer thawing.Done()
				time.Sleep(c.StopFor)
				_ = w.Cont()
				c.Logf("chaos: SIGCONT worker %d (pid %d)", i, w.Pid())
				mu.Lock()
				p := report.Workers[l].Paused
				p[len(p)-1].To = time.Now()
				delete(frozen, i)
				mu.Unlock()
			}(i, w, l)
			continue
		}
		mu.Lock()
		life(i).Died = time.Now() // before the signal: a takeover after it is explained
		mu.Unlock()
		w.Kill()
		report.Kills++
		c.Logf("chaos: SIGKILL worker %d (pid %d)", i, w.Pid())
		if err := start(i); err != nil {
			return report, err
		}
	}

	// Quiet phase: every worker alive and thawed, wait for the work to finish.
	thawing.Wait()
	for i, w := range workers {
		if w.Exited() {
			mu.Lock()
			if life(i).Died.IsZero() {
				life(i).Died = time.Now()
			}
			mu.Unlock()
			if err := start(i); err != nil {
				return report, err
			}
		}
	}
	report.Quiet, report.QuietErr = c.waitQuiet(ctx)
	return report, nil
}

// waitQuiet waits for Until with every worker alive: for QuietTimeout, or, with Progress,
// for as long as the work done keeps growing (QuietTimeout at most between two increases,
// QuietMax in all).
func (c *ChaosConfig) waitQuiet(ctx context.Context) (bool, error) {
	limit := c.QuietTimeout
	if c.Progress != nil {
		limit = c.QuietMax
	}
	quietCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	began := time.Now()
	lastDone, lastMoved := int64(-1), time.Now()
	for {
		quiet, err := c.Until(quietCtx)
		if err == nil && quiet {
			return true, nil
		}
		if c.Progress != nil {
			if done, perr := c.Progress(quietCtx); perr == nil && done > lastDone {
				lastDone, lastMoved = done, time.Now()
			}
			if time.Since(lastMoved) > c.QuietTimeout {
				return false, fmt.Errorf("not quiet after %s: no progress for %s (work done stands at %d)%s",
					time.Since(began).Round(100*time.Millisecond), c.QuietTimeout, lastDone, untilErr(err))
			}
		}
		select {
		case <-quietCtx.Done():
			return false, fmt.Errorf("not quiet after %s%s", limit, untilErr(err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func untilErr(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}
