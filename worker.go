package stepwise

import (
	"github.com/riverqueue/river"

	wfengine "github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflow"
)

// AddWorker registers the stepper w in workers as the worker of A's kind, as river.AddWorker
// registers a River worker: add it to Config.River.Workers before NewClient. The step engine
// is found at work time, through the worker middleware the Client installs in its River
// client; a job worked by a River client built without Stepwise fails its attempt with an
// error that names the fix (build the client with NewClient), and River retries it. It panics on bad wiring (a kind registered
// twice), like river.AddWorker.
func AddWorker[A river.JobArgs, C any](workers *river.Workers, w workflow.Stepper[A, C]) {
	wfengine.AddWorker(nil, workers, w)
}

// AddWorkerSafely is AddWorker returning an error instead of panicking.
func AddWorkerSafely[A river.JobArgs, C any](workers *river.Workers, w workflow.Stepper[A, C]) error {
	return wfengine.AddWorkerSafely(nil, workers, w)
}
