// Package faultpoint lets tests stop, kill or fail a process at named places in Stepwise's
// protocol code, to prove the protocol survives a crash at exactly that place.
//
// # Switching faults on
//
// Nothing is armed unless test code asks for it: a production binary that imports Stepwise
// ignores STEPWISE_FAULTS, so a stray variable in a deployment can neither SIGKILL the
// service nor stop it from starting. Test code arms faults explicitly, either in its own
// process with Configure, or in a child process with ArmFromEnv, which reads the
// STEPWISE_FAULTS environment variable (workflowtest.RunRoleIfChild calls it in every
// child a test starts with workflowtest.Start). STEPWISE_FAULTS is a
// comma-separated list of point:action rules, each optionally with @p=probability,
// @n=count (fire on the nth hit only) or @after=count (fire on every hit after count):
//
//	STEPWISE_FAULTS=after-send:kill@p=0.05,step-before-commit:stop@n=3
//
// Actions:
//
//   - kill: SIGKILL this process (what a power cut or OOM kill looks like);
//   - stop: SIGSTOP this process; something else (the test) must SIGCONT it. Every goroutine
//     stops, heartbeats included, as in a long GC pause or a frozen VM;
//   - pause=DURATION: sleep in this goroutine only (other goroutines go on);
//   - error: Hit returns ErrInjected, which the caller treats as any other failure.
//
// STEPWISE_FAULTS_SEED seeds the probability draws so a failing run can be repeated.
//
// # Cost when off
//
// Until a test arms a rule, Hit is one atomic load and a return: the points stay compiled
// into production code and cost nothing there.
package faultpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Names of the fault points built into Stepwise's protocol code.
const (
	AfterClaim         = "after-claim"          // lease taken, no step begun
	StepBeforeCommit   = "step-before-commit"   // user writes done, COMMIT not sent (fenced write issued, or for a step that continues about to go with the COMMIT)
	AfterStepCommit    = "after-step-commit"    // a step committed, the next not begun
	CommitAnswerLost   = "commit-answer-lost"   // a step's COMMIT landed; error: its answer is taken for an error
	AfterProcessing    = "after-processing"     // operation marked PROCESSING, not yet sent
	AfterSend          = "after-send"           // the external call returned, its outcome not recorded
	AfterOutcomeCommit = "after-outcome-commit" // outcomes recorded and committed
	TickAfterCommit    = "tick-after-commit"    // a schedule tick committed, its caller not told
	DispatcherIdle     = "dispatcher-idle"      // a dispatcher found nothing to claim and began the transaction completing its job
)

// ErrInjected is returned by Hit for the error action.
var ErrInjected = errors.New("stepwise: injected fault")

type rule struct {
	point  string
	action string
	pause  time.Duration
	p      float64
	n      int64 // fire on the nth hit only (0: any)
	after  int64 // fire on hits after this many
	hits   atomic.Int64
}

var (
	enabled atomic.Bool
	mu      sync.Mutex
	rules   map[string][]*rule
	rng     *rand.Rand
)

// Env and SeedEnv are the environment variables ArmFromEnv reads.
const (
	Env     = "STEPWISE_FAULTS"
	SeedEnv = "STEPWISE_FAULTS_SEED"
)

// ArmFromEnv configures the rules from STEPWISE_FAULTS and STEPWISE_FAULTS_SEED. Only test
// code calls it (workflowtest.RunRoleIfChild does, in a child process a test started), never
// a package init: an imported library must not let an environment variable kill a
// production process. The caller should treat an error as fatal: a typo in a fault spec
// must not silently test nothing.
func ArmFromEnv() error {
	return Configure(os.Getenv(Env), os.Getenv(SeedEnv))
}

// Configure replaces the fault rules (tests in one process use it; subprocesses use the
// environment). An empty spec switches every point off.
func Configure(spec, seed string) error {
	parsed := map[string][]*rule{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		r, err := parseRule(part)
		if err != nil {
			return fmt.Errorf("STEPWISE_FAULTS rule %q: %w", part, err)
		}
		parsed[r.point] = append(parsed[r.point], r)
	}
	s := uint64(time.Now().UnixNano())
	if seed != "" {
		v, err := strconv.ParseUint(seed, 10, 64)
		if err != nil {
			return fmt.Errorf("STEPWISE_FAULTS_SEED %q: want an unsigned integer", seed)
		}
		s = v
	}
	mu.Lock()
	rules = parsed
	rng = rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
	mu.Unlock()
	enabled.Store(len(parsed) > 0)
	return nil
}

func parseRule(s string) (*rule, error) {
	point, rest, ok := strings.Cut(s, ":")
	if !ok || point == "" {
		return nil, errors.New("want point:action[@p=0.1|@n=3|@after=3]")
	}
	fields := strings.Split(rest, "@")
	r := &rule{point: point, p: 1}
	action, arg, _ := strings.Cut(fields[0], "=")
	switch action {
	case "kill", "stop", "error":
		r.action = action
	case "pause":
		d, err := time.ParseDuration(arg)
		if err != nil {
			return nil, fmt.Errorf("pause wants a duration, as pause=20s: %w", err)
		}
		r.action, r.pause = action, d
	default:
		return nil, fmt.Errorf("unknown action %q; use kill, stop, pause=DURATION or error", action)
	}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "p":
			r.p, err = strconv.ParseFloat(v, 64)
			if err == nil && (r.p < 0 || r.p > 1) {
				err = errors.New("probability must be within 0..1")
			}
		case "n":
			r.n, err = strconv.ParseInt(v, 10, 64)
		case "after":
			r.after, err = strconv.ParseInt(v, 10, 64)
		default:
			err = fmt.Errorf("unknown qualifier %q; use p, n or after", k)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return r, nil
}

// Hit marks that the process reached point. It returns nil, or ErrInjected for an error
// rule; kill and stop rules act on the whole process.
func Hit(point string) error {
	if !enabled.Load() {
		return nil
	}
	mu.Lock()
	rs := rules[point]
	var fire *rule
	for _, r := range rs {
		h := r.hits.Add(1)
		if r.n > 0 && h != r.n {
			continue
		}
		if h <= r.after {
			continue
		}
		if r.p < 1 && rng.Float64() >= r.p {
			continue
		}
		fire = r
		break
	}
	mu.Unlock()
	if fire == nil {
		return nil
	}
	fmt.Fprintf(os.Stderr, "stepwise-fault: %s:%s pid=%d\n", point, fire.action, os.Getpid())
	switch fire.action {
	case "kill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way; never run past the point
	case "stop":
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		// In a multi-threaded process the stop lands asynchronously, shortly after kill
		// returns; without this wait the caller could run past the point before it does.
		time.Sleep(100 * time.Millisecond)
	case "pause":
		time.Sleep(fire.pause)
	case "error":
		return fmt.Errorf("%w at %s", ErrInjected, point)
	}
	return nil
}
