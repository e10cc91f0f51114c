package workflowtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Interval is a span of time; a zero To means it had not ended when the record was read.
type Interval struct {
	From, To time.Time
}

func (i Interval) overlaps(from, to time.Time) bool {
	return !i.From.After(to) && (i.To.IsZero() || !i.To.Before(from))
}

// WorkerLife is one worker process's life as a fault-injection harness saw it: when it
// started and died, and when it was paused (SIGSTOP) or cut off from the database. RunChaos
// records one per process it starts (ChaosReport.Workers).
type WorkerLife struct {
	// ID is the prefix of the lease owners of the process: the River client ID it was
	// started with (workflow lease owners are "<client id>/job-<id>/attempt-<n>").
	ID  string
	Pid int
	// Started and Died bound the process's life; a zero Died means it was alive at the end.
	Started, Died time.Time
	// Paused are the spans it could not run: SIGSTOP..SIGCONT, and those a harness knows
	// from the process itself (it measured itself not scheduled, on a loaded machine).
	// CutOff are the spans it could not reach the database.
	Paused, CutOff []Interval
}

// interrupted reports why the process could not have been working its run at some point in
// [from, to], or "" if it was alive, running and connected throughout.
// A death any time before to counts, not only within the window: a dead process never
// renews, claims or releases again, however late maintenance comes to its run (every worker
// may be dead for a while). Pauses and cut-offs count only if they overlap [from, to] and
// last at least min.
func (w *WorkerLife) interrupted(from, to time.Time, min time.Duration) string {
	switch {
	case !w.Died.IsZero() && !w.Died.After(to):
		return "killed at " + stamp(w.Died)
	}
	for _, p := range w.Paused {
		if p.overlaps(from, to) && p.To.Sub(p.From) >= min {
			return "paused at " + stamp(p.From)
		}
	}
	for _, c := range w.CutOff {
		if c.overlaps(from, to) && c.To.Sub(c.From) >= min {
			return "cut off at " + stamp(c.From)
		}
	}
	return ""
}

// Liveness is what a harness knows about its worker processes, for the takeover checks of
// CheckInvariants (CheckOpts.Liveness).
type Liveness struct {
	// Workers are every worker process of the test, dead ones included.
	Workers []WorkerLife

	// Window is how long before a takeover an interruption of the holder (kill, pause, cut
	// off) still explains it: the lease plus the maintenance interval, with slack for a
	// loaded machine. Required.
	Window time.Duration

	// UnleasedPause is the shortest pause or cut-off that explains a takeover of a run
	// nobody held: a job fetched and not yet claimed, or a run released and not yet recorded
	// snoozed. Maintenance leaves those states two Leases (a lapsed lease of the job's own
	// fetch one), so a short
	// stall of a live process there explains nothing, though it may explain a lapsed lease.
	// Zero: any pause explains it.
	UnleasedPause time.Duration

	// MaxAttempts is the River job's MaxAttempts: a run may be failed for crashing or
	// erroring that many times, not fewer. Defaults to river.MaxAttemptsDefault.
	MaxAttempts int
}

// TakeoverCount sums up the takeovers of a run (stepwise_event 'run.takeover').
type TakeoverCount struct {
	// Takeovers is every takeover.
	Takeovers int
	// Needless are takeovers of a run whose holder was alive, running and connected.
	Needless int
	// UnknownHolder are takeovers whose holder is none of the known workers (or that had
	// no holder: the worker died before it claimed); they count as justified.
	UnknownHolder int
}

// takeover is one run.takeover event with the owner of the run's last claim before it.
type takeover struct {
	key, holder string
	// fetchedBy is the River client that had last fetched the run's old job when the
	// takeover was decided: a worker killed (or frozen) after fetching it and before claiming
	// leaves the last claim to an earlier, healthy holder, and it is the fetcher's death that
	// the takeover answers. It is the one the takeover event recorded (fetched_by), not the
	// job's attempted_by as read now: after the takeover the old job is fetched again, by
	// whichever process finds it superseded, and that process never held the run.
	fetchedBy string
	id        int64
	at        time.Time
	// claimedAt is when the holder claimed (zero without a claim); releasedAt and
	// releaseReason the holder's last release of the run after that claim (zero if it had
	// not released).
	claimedAt, releasedAt time.Time
	releaseReason         string
	// fetchedAt is when the old job was last fetched, as the takeover event recorded it.
	fetchedAt time.Time
}

// trail says when the old job was fetched and what the holder last did with the run before
// the takeover: when it claimed, and whether it had released the run since. A released run
// was taken over for a job fetched and not claimed (or not yet recorded snoozed), one not
// released for a lease that lapsed.
func (t *takeover) trail() string {
	s := ""
	if !t.fetchedAt.IsZero() {
		s = fmt.Sprintf("; the job was fetched at %s (%s before)", stamp(t.fetchedAt), t.at.Sub(t.fetchedAt).Round(time.Millisecond))
	}
	if t.claimedAt.IsZero() {
		return s
	}
	s += fmt.Sprintf("; the holder claimed at %s (%s before)", stamp(t.claimedAt), t.at.Sub(t.claimedAt).Round(time.Millisecond))
	if t.releasedAt.IsZero() {
		return s + " and had not released the run: its lease lapsed"
	}
	return s + fmt.Sprintf(" and released it at %s (%s, %s before)",
		stamp(t.releasedAt), t.releaseReason, t.at.Sub(t.releasedAt).Round(time.Millisecond))
}

// failedRun is a run that ended failed, with what its last events say.
type failedRun struct {
	key, lastError, by string
	stepErrors         int
	deliberate         bool // the step returned workflow.Fail: the user's decision
}

const (
	NameNeedlessTakeover = "no takeover of a run whose worker was alive, running and connected"
	NameFailedEarly      = "a run is failed only after MaxAttempts crashes or errors"
)

// loadLiveness reads the takeovers and failed runs the liveness checks judge.
func loadLiveness(ctx context.Context, q stepwisetype.DBTX) ([]takeover, []failedRun, error) {
	rows, err := q.Query(ctx, `
		SELECT t.subject, t.id, t.at, coalesce(c.actor, ''),
		       coalesce(t.detail->>'fetched_by',
		                -- Trails written before takeovers recorded their fetcher: the job as it is now.
		                (SELECT j.attempted_by[cardinality(j.attempted_by)] FROM river_job j
		                  WHERE j.id = (t.detail->>'old_job')::bigint), ''),
		       coalesce(c.at, 'epoch'), coalesce(rl.at, 'epoch'), coalesce(rl.detail->>'reason', ''),
		       coalesce((t.detail->>'fetched_at')::timestamptz, 'epoch')
		  FROM stepwise_event t
		  LEFT JOIN LATERAL (SELECT c.id, c.actor, c.at FROM stepwise_event c
		                      WHERE c.subject = t.subject AND c.kind = 'lease.claim' AND c.id < t.id
		                      ORDER BY c.id DESC LIMIT 1) c ON true
		  LEFT JOIN LATERAL (SELECT r.at, r.detail FROM stepwise_event r
		                      WHERE r.subject = t.subject AND r.kind = 'run.release' AND r.id > c.id AND r.id < t.id AND r.actor = c.actor
		                      ORDER BY r.id DESC LIMIT 1) rl ON true
		 WHERE t.kind = 'run.takeover' ORDER BY t.id`)
	if err != nil {
		return nil, nil, fmt.Errorf("reading takeovers: %w", err)
	}
	var tos []takeover
	var t takeover
	if _, err := pgx.ForEachRow(rows, []any{&t.key, &t.id, &t.at, &t.holder, &t.fetchedBy, &t.claimedAt, &t.releasedAt, &t.releaseReason, &t.fetchedAt}, func() error {
		for _, at := range []*time.Time{&t.claimedAt, &t.releasedAt, &t.fetchedAt} {
			if at.Unix() == 0 {
				*at = time.Time{}
			}
		}
		tos = append(tos, t)
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("reading takeovers: %w", err)
	}
	rows, err = q.Query(ctx, `
		SELECT r.key, coalesce(r.last_error, ''), coalesce(f.actor, ''), coalesce(f.detail ? 'steps', false),
		       (SELECT count(*) FROM stepwise_event e WHERE e.subject = r.key AND e.kind = 'run.step_error')
		  FROM stepwise_run r
		  LEFT JOIN LATERAL (SELECT actor, detail FROM stepwise_event f WHERE f.subject = r.key AND f.kind = 'run.finish'
		                      ORDER BY f.id DESC LIMIT 1) f ON true
		 WHERE r.status = 'failed' ORDER BY r.key`)
	if err != nil {
		return nil, nil, fmt.Errorf("reading failed runs: %w", err)
	}
	var frs []failedRun
	var f failedRun
	if _, err := pgx.ForEachRow(rows, []any{&f.key, &f.lastError, &f.by, &f.deliberate, &f.stepErrors}, func() error {
		frs = append(frs, f)
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("reading failed runs: %w", err)
	}
	return tos, frs, nil
}

// CountTakeovers counts the takeovers in the database and judges each against l, returning
// a violation per needless one (and per run failed too early).
func CountTakeovers(ctx context.Context, q stepwisetype.DBTX, l *Liveness) (TakeoverCount, []Violation, error) {
	tos, frs, err := loadLiveness(ctx, q)
	if err != nil {
		return TakeoverCount{}, nil, err
	}
	c, vs := checkLiveness(tos, frs, l)
	return c, vs, nil
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// checkLiveness is pure, so each check can be shown to fail on hand-made records.
func checkLiveness(tos []takeover, frs []failedRun, l *Liveness) (TakeoverCount, []Violation) {
	maxAttempts := l.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = river.MaxAttemptsDefault
	}
	byID := map[string]*WorkerLife{}
	for i := range l.Workers {
		byID[l.Workers[i].ID] = &l.Workers[i]
	}
	var c TakeoverCount
	var out []Violation
	justified := map[string]int{}
	needless := map[string]int{}
	for _, t := range tos {
		c.Takeovers++
		holderID, _, _ := strings.Cut(t.holder, "/")
		w := byID[holderID]
		from := t.at.Add(-l.Window)
		// A job fetched after the holder's claim (the takeover's own job, or the holder's
		// snoozed job fetched again), by whichever process, is its fetcher's: it held no
		// lease, and the takeover answers the fetcher alone, from its fetch on. Whatever
		// became of the holder before (killed long ago, paused before the fetch) explains
		// nothing now; nor does a pause of the fetcher that ended before it fetched.
		if t.fetchedBy != "" && !t.fetchedAt.IsZero() && t.fetchedAt.After(t.claimedAt) {
			f := byID[t.fetchedBy]
			if f == nil {
				c.UnknownHolder++
				justified[t.key]++
				continue
			}
			if f.interrupted(latest(from, t.fetchedAt), t.at, l.UnleasedPause) != "" {
				justified[t.key]++
				continue
			}
			c.Needless++
			needless[t.key]++
			out = append(out, Violation{Invariant: 5, Name: NameNeedlessTakeover, Evidence: fmt.Sprintf(
				"run %s taken over at %s (event %d) for the job %s fetched (pid %d, up since %s) after the last claim (%q), and that process was neither killed, paused nor cut off (for %s or more) since its fetch%s",
				t.key, stamp(t.at), t.id, t.fetchedBy, f.Pid, stamp(f.Started), t.holder, l.UnleasedPause, t.trail())})
			continue
		}
		if w == nil {
			c.UnknownHolder++
			justified[t.key]++
			continue
		}
		min := time.Duration(0)
		switch {
		case !t.releasedAt.IsZero():
			// Released on purpose: only what kept River from recording the snooze after it.
			min = l.UnleasedPause
			from = latest(from, t.releasedAt)
		case !t.claimedAt.IsZero():
			// A lapsed lease: a pause that ended before the claim did not lapse it.
			from = latest(from, t.claimedAt)
		}
		if w.interrupted(from, t.at, min) != "" {
			justified[t.key]++
			continue
		}
		if f := byID[t.fetchedBy]; t.fetchedBy != "" && t.fetchedBy != holderID && (f == nil || f.interrupted(from, t.at, min) != "") {
			justified[t.key]++ // the job's fetcher died (or is unknown) before it claimed
			continue
		}
		c.Needless++
		needless[t.key]++
		fetched := ""
		if t.fetchedBy != "" && t.fetchedBy != holderID {
			fetched = fmt.Sprintf("; its job was last fetched by %s, alive too", t.fetchedBy)
		}
		out = append(out, Violation{Invariant: 5, Name: NameNeedlessTakeover, Evidence: fmt.Sprintf(
			"run %s taken over at %s (event %d) from %s (pid %d, up since %s), which was neither killed, paused nor cut off (for %s or more) in the %s before%s%s",
			t.key, stamp(t.at), t.id, t.holder, w.Pid, stamp(w.Started), min, l.Window, fetched, t.trail())})
	}
	for _, f := range frs {
		if f.deliberate {
			continue
		}
		crashes := justified[f.key]
		if f.by == "maintenance" {
			crashes++ // maintenance fails a run it finds stuck: count that as a crash too
		}
		if crashes+f.stepErrors < maxAttempts {
			out = append(out, Violation{Invariant: 5, Name: NameFailedEarly, Evidence: fmt.Sprintf(
				"run %s failed (by %s: %q) after %d crash(es) and %d step error(s), fewer than MaxAttempts %d (needless takeovers: %d)",
				f.key, f.by, f.lastError, crashes, f.stepErrors, maxAttempts, needless[f.key])})
		}
	}
	return c, out
}
