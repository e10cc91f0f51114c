//go:build !race

package workflow_test

// raceDetector reports whether the tests run under the race detector, which makes every
// worker process of a drill several times slower to start and to run.
const raceDetector = false
