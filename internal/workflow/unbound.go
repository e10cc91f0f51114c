package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// engineKey is the context key under which the worker middleware Install adds to a River
// client carries that client's Engine to the step workers added without one.
type engineKey struct{}

// engineFromContext returns the Engine the running River client was installed with, or nil.
func engineFromContext(ctx context.Context) *Engine {
	e, _ := ctx.Value(engineKey{}).(*Engine)
	return e
}

// middleware is the worker middleware Install adds to the River config (as a plugin): it
// tells each job which Engine its client runs, so that a step worker added without an Engine
// (the stepwise.AddWorker form, River's style) works with the Engine of the client that
// fetched the job. Guards against: a Workers bundle shared by several clients working runs
// with the Engine (and the pool) of another client.
func (e *Engine) middleware() river.WorkerMiddlewareFunc {
	return func(ctx context.Context, _ *rivertype.JobRow, doInner func(context.Context) error) error {
		return doInner(context.WithValue(ctx, engineKey{}, e))
	}
}

// installMiddleware adds e's middleware to rc's Plugins, which River accepts beside either
// form of middleware config (it refuses Middleware beside the older pair).
func (e *Engine) installMiddleware(rc *river.Config) {
	rc.Plugins = append(rc.Plugins, e.middleware())
}

// unboundSlices are the StepOptions.Slice of the step workers added without an Engine, by
// Workers bundle and kind, which Install checks against the config's RescueStuckJobsAfter
// when the bundle's config is installed.
var unboundSlices = struct {
	sync.Mutex
	m map[*river.Workers]map[string]time.Duration
}{m: map[*river.Workers]map[string]time.Duration{}}

// unboundWorker is the River worker of a Stepper added without an Engine: it finds the Engine
// at work time, in the context the Engine's middleware set, and works the job as the step
// worker bound to that Engine would.
type unboundWorker[A river.JobArgs, C any] struct {
	river.WorkerDefaults[A]
	w       Stepper[A, C]
	slice   time.Duration // StepOptions.Slice, or 0 for the Engine's Config.Slice
	workers *river.Workers

	mu    sync.Mutex
	bound map[*Engine]*stepWorker[A, C]
	byJob map[int64]*stepWorker[A, C] // the bound worker that last worked each job, for NextRetry
}

// Timeout is no timeout for River: the Engine, hence the attempt's timeout, is known only at
// work time, where Work sets it (the bound worker's Timeout).
func (u *unboundWorker[A, C]) Timeout(*river.Job[A]) time.Duration { return -1 }

// ErrNoEngine is the error of a step worker added with stepwise.AddWorker (no Engine) when the
// River client running it has no Engine installed.
var ErrNoEngine = errors.New("stepwise: this step worker (stepwise.AddWorker) is being worked by a River client that stepwise.NewClient did not build; " +
	"build the client with stepwise.NewClient (its River config is the one you give it) and use client.River() for your own inserts")

func (u *unboundWorker[A, C]) Work(ctx context.Context, job *river.Job[A]) error {
	e := engineFromContext(ctx)
	if e == nil {
		// Guards against: a stepper run by a plain River client stepping without a lease,
		// a fence or the failure budget. Not cancelled: once the deployment is fixed, River's
		// retry works the run.
		return fmt.Errorf("job %d (%s): %w", job.ID, job.Kind, ErrNoEngine)
	}
	sw := u.boundTo(e)
	u.mu.Lock()
	if len(u.byJob) >= retryStashMax {
		u.byJob = map[int64]*stepWorker[A, C]{}
	}
	u.byJob[job.ID] = sw
	u.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, sw.Timeout(job))
	defer cancel()
	return sw.Work(ctx, job)
}

// NextRetry asks the bound worker that returned the job's error.
func (u *unboundWorker[A, C]) NextRetry(job *river.Job[A]) time.Time {
	u.mu.Lock()
	sw := u.byJob[job.ID]
	delete(u.byJob, job.ID)
	u.mu.Unlock()
	if sw == nil {
		return time.Time{}
	}
	return sw.NextRetry(job)
}

func (u *unboundWorker[A, C]) boundTo(e *Engine) *stepWorker[A, C] {
	u.mu.Lock()
	defer u.mu.Unlock()
	if sw := u.bound[e]; sw != nil {
		return sw
	}
	slice := u.slice
	if slice == 0 {
		slice = e.cfg.Slice
	}
	sw := &stepWorker[A, C]{e: e, w: u.w, slice: slice, workers: u.workers}
	u.bound[e] = sw
	return sw
}

// addUnbound registers w in workers with no Engine: the Engine installed in the River client
// that works the job is used (AddWorker with a nil Engine).
func addUnbound[A river.JobArgs, C any](workers *river.Workers, w Stepper[A, C]) error {
	var a A
	var slice time.Duration
	if o := w.StepOptions(); o != nil && o.Slice != 0 {
		if o.Slice < 0 {
			return fmt.Errorf("stepwise.AddWorker(%s): StepOptions.Slice is %s; it must be positive (0 means Config.Slice)", a.Kind(), o.Slice)
		}
		slice = o.Slice
	}
	u := &unboundWorker[A, C]{w: w, slice: slice, workers: workers,
		bound: map[*Engine]*stepWorker[A, C]{}, byJob: map[int64]*stepWorker[A, C]{}}
	if err := river.AddWorkerSafely[A](workers, u); err != nil {
		return err
	}
	if slice != 0 {
		unboundSlices.Lock()
		if unboundSlices.m[workers] == nil {
			unboundSlices.m[workers] = map[string]time.Duration{}
		}
		unboundSlices.m[workers][a.Kind()] = slice
		unboundSlices.Unlock()
	}
	return nil
}

// checkUnboundSlices checks the slices of the step workers added to workers without an
// Engine against River's rescue.
func checkUnboundSlices(workers *river.Workers, rescue time.Duration) error {
	unboundSlices.Lock()
	defer unboundSlices.Unlock()
	for kind, slice := range unboundSlices.m[workers] {
		if err := checkSlice(fmt.Sprintf("StepOptions.Slice of %s", kind), slice, rescue); err != nil {
			return err
		}
	}
	return nil
}
