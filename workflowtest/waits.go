package workflowtest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Names of the wait checks (docs/design.md, "Waits"; the drills table, drill 10).
const (
	NameWakeLate      = "no satisfied wait left asleep longer than lease + maintenance interval + margin"
	NameWakeLost      = "every satisfied wait is woken by its satisfier, not by maintenance's backstop"
	NameWaitTimedOut  = "no wait whose condition came to hold times out"
	NameOrphanChild   = "no child run left unfinished, none left running under a finished parent"
	NameParentEarly   = "a parent that waited for all its children finishes after all of them"
	NameSignalPending = "every signal sent to a run that waits for it is taken by a wait"
)

// Wake is one wait of a run that ended: what satisfied it and when the run's next step began.
// The harness fills it from what the step after the wait recorded (its Step.Woken and its
// start) and from what it knows of the satisfying writes.
type Wake struct {
	Run string
	// SatisfiedAt is when the condition came to hold: the commit of the satisfying write (the
	// last child's finish, the signal's insert), or the wait's start if it held already.
	SatisfiedAt time.Time
	// StepAt is when the step after the wait began.
	StepAt time.Time
	// Takeovers are the run's takeovers in (SatisfiedAt, StepAt]: the run was made due, a
	// worker took it and was interrupted, and the lease and maintenance brought it back.
	// The asleep time is then measured from the last one (each is itself a lease +
	// maintenance recovery, which the liveness checks judge).
	Takeovers []time.Time
	// Paused are the SIGSTOP spans of the worker that ran the step after the wait. A worker
	// frozen after fetching the woken run's job and before claiming it holds no lease, so no
	// takeover comes: the run waits for its fetcher to thaw, as any River job would. The
	// asleep time is measured from the end of such a span (the freeze is the fault, not the
	// wake).
	Paused []Interval
	// TimedOut is what Step.Woken said.
	TimedOut bool
}

// Asleep is how long the run slept with its wait satisfied: from SatisfiedAt, or from its last
// takeover after it, to StepAt.
func (w Wake) Asleep() time.Duration {
	from := w.SatisfiedAt
	for _, t := range w.Takeovers {
		if t.After(from) && !t.After(w.StepAt) {
			from = t
		}
	}
	for _, p := range w.Paused {
		if !p.To.IsZero() && p.To.After(from) && !p.To.After(w.StepAt) {
			from = p.To
		}
	}
	return max(w.StepAt.Sub(from), 0)
}

// WakeStats sums up the wakes judged.
type WakeStats struct {
	Wakes     int
	TakenOver int // wakes whose run was taken over, or whose worker was frozen, between satisfaction and its next step
	// P50, P99 and Max are of Asleep; Raw are of StepAt - SatisfiedAt (takeovers included).
	P50, P99, Max, RawMax time.Duration
}

func (s WakeStats) String() string {
	return fmt.Sprintf("%d wakes (%d taken over or frozen in between): asleep p50 %s p99 %s max %s; satisfied to next step max %s",
		s.Wakes, s.TakenOver, s.P50.Round(time.Millisecond), s.P99.Round(time.Millisecond), s.Max.Round(time.Millisecond), s.RawMax.Round(time.Millisecond))
}

// CheckWakes judges each wake: none asleep longer than bound (lease + maintenance interval +
// a scheduling margin), none timed out (the drill's waits are all satisfied long before their
// deadline). Pure, so that it can be shown to fail on hand-made wakes.
func CheckWakes(wakes []Wake, bound time.Duration) (WakeStats, []Violation) {
	var st WakeStats
	var out []Violation
	asleep := make([]time.Duration, 0, len(wakes))
	for _, w := range wakes {
		st.Wakes++
		a := w.Asleep()
		asleep = append(asleep, a)
		st.RawMax = max(st.RawMax, w.StepAt.Sub(w.SatisfiedAt))
		if a != w.StepAt.Sub(w.SatisfiedAt) {
			st.TakenOver++
		}
		if w.TimedOut {
			out = append(out, Violation{Invariant: 5, Name: NameWaitTimedOut, Evidence: fmt.Sprintf(
				"run %s: its wait timed out though satisfied at %s; next step at %s", w.Run, stamp(w.SatisfiedAt), stamp(w.StepAt))})
			continue
		}
		if a > bound {
			out = append(out, Violation{Invariant: 5, Name: NameWakeLate, Evidence: fmt.Sprintf(
				"run %s: satisfied at %s, next step at %s: asleep %s, over %s (takeovers between: %d, pauses of its worker: %d)",
				w.Run, stamp(w.SatisfiedAt), stamp(w.StepAt), a.Round(time.Millisecond), bound, len(w.Takeovers), len(w.Paused))})
		}
	}
	if len(asleep) > 0 {
		slices.Sort(asleep)
		pct := func(p float64) time.Duration { return asleep[min(len(asleep)-1, int(float64(len(asleep))*p))] }
		st.P50, st.P99, st.Max = pct(0.5), pct(0.99), asleep[len(asleep)-1]
	}
	return st, out
}

// CheckWaitTables checks, over Stepwise's wait tables, what must hold at quiet when every wait
// of the run was satisfiable (a CheckFunc for CheckOpts.Domain):
//
//   - no wake by maintenance: a satisfier that missed the wait (a lost wake, repaired by the
//     backstop within a maintenance interval, so a lateness bound alone does not see it);
//   - no child run unfinished, nor unfinished under a finished parent;
//   - a parent that succeeded after waiting for all its children finished after each of them;
//   - no signal left untaken (each run's waits take every signal sent to it).
func CheckWaitTables(ctx context.Context, q stepwisetype.DBTX) ([]Violation, error) {
	checks := []struct {
		inv         int
		name, query string
	}{
		{5, NameWakeLost, `
			SELECT format('run %s woken by maintenance at %s (event %s): its satisfier did not wake it', subject, at, id)
			  FROM stepwise_event WHERE kind = 'run.wake' AND actor = 'maintenance' ORDER BY id`},
		{5, NameOrphanChild, `
			SELECT format('child %s is %s; its parent %s is %s', c.key, c.status, c.parent_key, coalesce(p.status, 'missing'))
			  FROM stepwise_run c LEFT JOIN stepwise_run p ON p.key = c.parent_key
			 WHERE c.parent_key IS NOT NULL AND c.status IN ('pending', 'running') ORDER BY c.key`},
		{5, NameParentEarly, `
			SELECT format('parent %s finished at %s, before its child %s (%s at %s)', p.key, p.finished_at, c.key, c.status, c.finished_at)
			  FROM stepwise_run p JOIN stepwise_run c ON c.parent_key = p.key
			 WHERE p.status = 'succeeded' AND (c.finished_at IS NULL OR c.finished_at > p.finished_at)
			   AND EXISTS (SELECT 1 FROM stepwise_event e WHERE e.subject = p.key AND e.kind = 'run.wait'
			                  AND e.detail->>'wait' = 'children' AND NOT e.detail ? 'children')
			 ORDER BY p.key, c.key`},
		{5, NameSignalPending, `
			SELECT format('signal %s/%s of run %s (%s), sent at %s, never taken', s.name, s.signal_id, s.run_key, coalesce(r.status, 'no such run'), s.sent_at)
			  FROM stepwise_signal s LEFT JOIN stepwise_run r ON r.key = s.run_key
			 WHERE s.consumed_at IS NULL ORDER BY s.run_key, s.name, s.signal_id`},
	}
	var out []Violation
	for _, c := range checks {
		rows, err := q.Query(ctx, c.query)
		if err != nil {
			return out, fmt.Errorf("checking %q: %w", c.name, err)
		}
		evidence, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return out, fmt.Errorf("checking %q: %w", c.name, err)
		}
		for _, e := range evidence {
			out = append(out, Violation{Invariant: c.inv, Name: c.name, Evidence: e})
		}
	}
	return out, nil
}
