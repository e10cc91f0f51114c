package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	sw "github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
)

func runRuns(ctx context.Context, c *cli, args []string) error {
	return group(ctx, c, args, "list", []command{
		{"list", "list runs, newest first (the default): --status, --workflow, --schedule, --key-prefix", runsList},
		{"show", "one run: status, cursor, lease and holder, failures in a row and retry state, version, event trail", runsShow},
		{"cancel", "ask a pending or running run to stop (cooperatively; committed steps stay), audited", runsCancel},
		{"resume", "continue a failed or cancelled run from its last checkpoint, audited", runsResume},
	})
}

var runStatuses = []string{"pending", "running", "succeeded", "failed", "cancelled"}

// runRow is a run as listed.
type runRow struct {
	Key       string     `json:"key"`
	Workflow  string     `json:"workflow"`
	Status    string     `json:"status"`
	Schedule  *string    `json:"schedule,omitempty"`
	Steps     int64      `json:"steps"`
	Failures  int        `json:"failures"`
	Version   int64      `json:"version"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	Finished  *time.Time `json:"finished_at,omitempty"`
	LastError *string    `json:"last_error,omitempty"`
}

func runsList(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("[--status S] [--workflow W] [--schedule NAME] [--key-prefix P] [--limit N] [--json]", true, true)
	status := f.String("status", "", "only runs in this status: "+strings.Join(runStatuses, ", "))
	wf := f.String("workflow", "", "only runs of this workflow (the River job kind of its args, e.g. settle)")
	sched := f.String("schedule", "", "only the runs a schedule started")
	prefix := f.String("key-prefix", "", "only runs whose key starts with this, e.g. settle/2026-11")
	limit := f.limit(50, "runs")
	if _, err := f.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if *status != "" && !contains(runStatuses, *status) {
		return usageError("%s: --status %q: want one of %s", c.path, *status, strings.Join(runStatuses, ", "))
	}
	if err := checkLimit(c.path, *limit); err != nil {
		return err
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	runs, err := client.RunList(ctx, &sw.RunListParams{Status: workflow.RunStatus(*status), Workflow: *wf, Schedule: *sched, KeyPrefix: *prefix, Limit: *limit})
	if err != nil {
		return err
	}
	list := make([]runRow, len(runs))
	rows := make([][]string, len(runs))
	for i, r := range runs {
		list[i] = runRow{Key: r.Key, Workflow: r.Workflow, Status: string(r.Status), Schedule: r.Schedule, Steps: r.Steps, Failures: r.Failures,
			Version: r.Version, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Finished: r.FinishedAt, LastError: r.LastError}
		rows[i] = []string{r.Key, string(r.Status), r.Workflow, deref(r.Schedule), fmt.Sprint(r.Steps), fmt.Sprint(r.Failures), fmt.Sprint(r.Version), ts(r.UpdatedAt), oneLine(deref(r.LastError), 60)}
	}
	return f.print(listing{json: list, none: "no runs match", rows: rows, limit: *limit, narrow: "--status, --key-prefix",
		header: []string{"KEY", "STATUS", "WORKFLOW", "SCHEDULE", "STEPS", "FAILURES", "VERSION", "UPDATED", "LAST ERROR"}})
}

// event is one row of the audit trail.
type event struct {
	ID     int64           `json:"id"`
	At     time.Time       `json:"at"`
	Kind   string          `json:"kind"`
	From   string          `json:"from,omitempty"`
	To     string          `json:"to,omitempty"`
	Actor  string          `json:"actor,omitempty"`
	Token  *int64          `json:"token,omitempty"`
	Detail json.RawMessage `json:"detail,omitempty"`
}

func readEvents(ctx context.Context, q pgx.Tx, subject string, limit int, newestFirst bool) ([]event, error) {
	order := "id"
	if newestFirst {
		order = "id DESC"
	}
	rows, err := q.Query(ctx, `SELECT id, at, kind, coalesce(from_state, ''), coalesce(to_state, ''), coalesce(actor, ''), token, detail
		FROM stepwise_event WHERE subject = $1 ORDER BY `+order+` LIMIT $2`, subject, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the events of %s: %w", subject, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (event, error) {
		var e event
		err := r.Scan(&e.ID, &e.At, &e.Kind, &e.From, &e.To, &e.Actor, &e.Token, &e.Detail)
		return e, err
	})
}

// runShow is "runs show"'s JSON.
type runShow struct {
	*workflow.Run `json:"-"`
	RunJSON       runJSON         `json:"run"`
	Cursor        json.RawMessage `json:"cursor"`
	CursorVersion int             `json:"cursor_version"`
	Steps         int64           `json:"steps"`
	Holder        string          `json:"lease_holder,omitempty"`
	LeaseUntil    *time.Time      `json:"lease_until,omitempty"`
	FencingToken  int64           `json:"fencing_token"`
	Events        []event         `json:"events"`
}

func runsShow(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("KEY [--events N] [--json]", true, true)
	n := f.Int("events", 20, "the newest N events of the run's trail (1 to 1000)")
	pos, err := f.parse(args, 1, 1, "KEY (the run's key, as \"stepwise runs\" lists it)")
	if err != nil {
		return err
	}
	if *n < 1 || *n > 1000 {
		return usageError("%s: --events %d: want 1 to 1000", c.path, *n)
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var out runShow
	// One snapshot: the run, its checkpoint and its events agree.
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		run, err := client.RunGetTx(ctx, tx, pos[0])
		if errors.Is(err, stepwisetype.ErrNotFound) {
			return fmt.Errorf("%w: no run with key %q; list them with \"stepwise runs --key-prefix ...\"", errNotFound, pos[0])
		}
		if err != nil {
			return err
		}
		out.Run, out.Steps = run, run.Steps
		// The cursor and the lease are the checkpoint's, which no client call reads.
		var holder *string
		if err := tx.QueryRow(ctx, `SELECT cursor, cursor_version, owner, lease_until, fencing_token FROM stepwise_checkpoint WHERE key = $1`, run.Key).
			Scan(&out.Cursor, &out.CursorVersion, &holder, &out.LeaseUntil, &out.FencingToken); err != nil {
			return fmt.Errorf("reading the run's checkpoint: %w", err)
		}
		out.Holder = deref(holder)
		out.Events, err = readEvents(ctx, tx, run.Key, *n, true)
		return err
	})
	if err != nil {
		return err
	}
	if f.json {
		out.Events = nonNil(out.Events)
		out.RunJSON = toRunJSON(out.Run)
		return c.printJSON(out)
	}
	r := out.Run
	w := c.stdout
	fmt.Fprintf(w, "run        %s\n", r.Key)
	fmt.Fprintf(w, "workflow   %s\n", r.Workflow)
	fmt.Fprintf(w, "status     %s (version %d)\n", r.Status, r.Version)
	if r.Schedule != nil {
		fmt.Fprintf(w, "schedule   %s slot %s shard %d\n", *r.Schedule, tsp(r.Slot), derefInt(r.Shard))
	}
	fmt.Fprintf(w, "input      %s\n", oneLine(string(r.Input), 200))
	cursor := oneLine(string(out.Cursor), 200)
	if cursor == "" || cursor == "null" {
		cursor = "(none committed)"
	}
	fmt.Fprintf(w, "cursor     %s after %d steps (cursor version %d)\n", cursor, out.Steps, out.CursorVersion)
	lease := "none"
	if out.Holder != "" {
		lease = fmt.Sprintf("held by %s until %s (fencing token %d)", out.Holder, tsp(out.LeaseUntil), out.FencingToken)
		if out.LeaseUntil != nil && out.LeaseUntil.Before(time.Now()) {
			lease += ": lapsed, another worker may take it over"
		}
	}
	fmt.Fprintf(w, "lease      %s\n", lease)
	fmt.Fprintf(w, "failures   %d in a row (%d in all), %d claims\n", r.FailuresInARow, r.Failures, r.Attempts)
	if r.Retry != nil {
		next := "when River records the retry"
		if r.Retry.NextTryAt != nil {
			next = ts(*r.Retry.NextTryAt)
		}
		fmt.Fprintf(w, "retry      waiting: %d of %d failures, next try %s; last error: %s\n", r.Retry.FailuresInARow, r.Retry.MaxFailures, next, oneLine(r.Retry.LastError, 200))
	}
	if r.LastError != nil {
		fmt.Fprintf(w, "last error %s\n", oneLine(*r.LastError, 300))
	}
	if r.CancelRequestedAt != nil {
		fmt.Fprintf(w, "cancel     requested %s\n", ts(*r.CancelRequestedAt))
	}
	if r.WakeAt != nil {
		fmt.Fprintf(w, "wakes at   %s\n", ts(*r.WakeAt))
	}
	if r.Parent != nil {
		fmt.Fprintf(w, "parent     %s\n", *r.Parent)
	}
	if r.Wait != nil {
		woken := ""
		if r.Wait.WokenAt != nil {
			woken = fmt.Sprintf("; woken %s by %s, waiting for a worker", ts(*r.Wait.WokenAt), r.Wait.WokenBy)
		}
		fmt.Fprintf(w, "waits      for %s since %s, times out %s: %s%s\n", r.Wait.Kind, ts(r.Wait.Since), ts(r.Wait.Deadline), r.Wait.Missing, woken)
	}
	if r.Awaiting != nil {
		fmt.Fprintf(w, "deploy     %s: a newer release committed its cursor and only older workers met it since; deploy workers that read it\n", r.Awaiting)
	}
	fmt.Fprintf(w, "created    %s; updated %s; finished %s\n", ts(r.CreatedAt), ts(r.UpdatedAt), tsp(r.FinishedAt))
	if r.HistoryPrunedAt != nil {
		fmt.Fprintf(w, "history    pruned %s (people's decisions kept)\n", ts(*r.HistoryPrunedAt))
	}
	switch r.Status {
	case workflow.RunStatusFailed, workflow.RunStatusCancelled:
		fmt.Fprintf(w, "next       stepwise runs resume %s --seen-version %d --reason \"...\"\n", r.Key, r.Version)
	case workflow.RunStatusPending, workflow.RunStatusRunning:
		fmt.Fprintf(w, "next       stepwise runs cancel %s --seen-version %d --reason \"...\" (if it must stop)\n", r.Key, r.Version)
	}
	fmt.Fprintf(w, "\nevents (newest first, at most %d):\n", *n)
	printEvents(c, out.Events)
	return nil
}

func printEvents(c *cli, events []event) {
	if len(events) == 0 {
		fmt.Fprintln(c.stdout, "  (none)")
		return
	}
	rows := make([][]string, len(events))
	for i, e := range events {
		move := ""
		if e.From != "" || e.To != "" {
			move = e.From + " -> " + e.To
		}
		tok := ""
		if e.Token != nil {
			tok = fmt.Sprint(*e.Token)
		}
		rows[i] = []string{"  " + ts(e.At), e.Kind, move, e.Actor, tok, oneLine(string(e.Detail), 120)}
	}
	c.table([]string{"  AT", "KIND", "MOVE", "ACTOR", "TOKEN", "DETAIL"}, rows)
}

func runsCancel(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("KEY --reason TEXT [--actor NAME] [--seen-version N] [--json]", true, true)
	key, a, seen, err := f.runDecision(args, "why the run must stop", "refused if the run changed status since. Default: not checked")
	if err != nil {
		return err
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var status workflow.RunStatus
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The client locks the run, checks the version seen and records the request; the
		// command's audit row commits with it.
		run, err := client.RunCancelTx(ctx, tx, key, &sw.RunCancelOpts{Actor: a.actor, Reason: a.reason, ExpectedVersion: seen})
		var changed *workflow.RunChangedError
		switch {
		case errors.Is(err, stepwisetype.ErrNotFound):
			return fmt.Errorf("%w: no run with key %q; list them with \"stepwise runs\"", errNotFound, key)
		case errors.As(err, &changed):
			return fmt.Errorf("run %q is %s at version %d now, not version %d as you saw: nothing was changed; look again (stepwise runs show %s) before deciding", key, changed.Status, changed.Version, seen, key)
		case errors.Is(err, sw.ErrRunNotCancellable):
			if run, rerr := client.RunGetTx(ctx, tx, key); rerr == nil {
				return fmt.Errorf("run %q is %s: only a pending or running run can be cancelled; nothing was changed", key, run.Status)
			}
			return err
		case err != nil:
			return err
		}
		status = run.Status
		return auditAction(ctx, tx, key, "run.cancel", string(status), "cancel_requested", a)
	})
	if err != nil {
		return err
	}
	if f.json {
		return c.printJSON(map[string]any{"key": key, "was": status, "cancel_requested": true, "actor": a.actor, "reason": a.reason})
	}
	fmt.Fprintf(c.stdout, "run %s (%s) asked to stop by %s (%q): it ends cancelled at its next step boundary or claim; committed steps stay. Follow it with: stepwise runs show %s\n",
		key, status, a.actor, a.reason, key)
	return nil
}

// runDecision registers --reason, --actor and --seen-version (seenHelp says what it guards
// and its default), parses the run's key and checks them all before anything is read.
func (f *flags) runDecision(args []string, reasonHelp, seenHelp string) (key string, a auditFlags, seen int64, err error) {
	a.register(f, reasonHelp)
	f.Int64Var(&seen, "seen-version", 0, "the run's version you decided on, as \"stepwise runs show\" prints it; "+seenHelp)
	pos, err := f.parse(args, 1, 1, "KEY (the run's key)")
	if err != nil {
		return "", a, 0, err
	}
	if err := a.check(f.c.path); err != nil {
		return "", a, 0, err
	}
	if err := seenVersion(f.c.path, seen, "stepwise runs"); err != nil {
		return "", a, 0, err
	}
	return pos[0], a, seen, nil
}

// auditAction records an operator's action in tx as the console does (console.ActionEvent,
// kept forever by retention), marked as done with this command and from which host.
func auditAction(ctx context.Context, tx pgx.Tx, subject, action, from, to string, a auditFlags) error {
	host, _ := os.Hostname()
	_, err := tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
		VALUES ($1, $2, nullif($3, ''), nullif($4, ''), $5, jsonb_build_object('action', $6::text, 'reason', $7::text, 'via', 'stepwise command', 'host', $8::text))`,
		subject, console.ActionEvent, from, to, a.actor, action, a.reason, host)
	return err
}

func runsResume(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("KEY --reason TEXT --seen-version N [--actor NAME] [--json]", true, true)
	key, a, seen, err := f.runDecision(args, "why the run can go on now, e.g. the incident fixed",
		"required; refused if the run changed since (resumed, run and failed again). Without it the command refuses and prints the version the run has now")
	if err != nil {
		return err
	}
	// An operator's client (an insert-only River client, no workers): the resume inserts the
	// run's job, and the service's own workers run it.
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if seen == 0 {
		// Guards against a resume on what the run is when the command runs rather than on
		// what the person saw: a run a colleague resumed, and that failed again for another
		// reason, would be resumed blindly. Say what the run is now; the person confirms it by
		// passing its version.
		var run *workflow.Run
		if run, err = client.RunGet(ctx, key); err == nil && !resumable(run.Status) {
			err = fmt.Errorf("%w: run %s is %s (version %d); only a failed or cancelled run can be resumed", workflow.ErrRunNotResumable, key, run.Status, run.Version)
		} else if err == nil {
			last := ""
			if run.LastError != nil && *run.LastError != "" {
				last = fmt.Sprintf(", last error %q", *run.LastError)
			}
			return usageError("%s: --seen-version is required: run %s is %s now (version %d%s); if that is the run you decided to resume, run the command again with --seen-version %d",
				f.c.path, key, run.Status, run.Version, last, run.Version)
		}
	}
	var res *sw.RunResumeResult
	if err == nil {
		res, err = client.RunResume(ctx, key, &sw.RunResumeOpts{Actor: a.actor, Reason: a.reason, ExpectedVersion: seen})
	}
	switch {
	case errors.Is(err, stepwisetype.ErrNotFound):
		return fmt.Errorf("%w; list runs with \"stepwise runs --status failed\"", err)
	case errors.Is(err, stepwisetype.ErrChanged), errors.Is(err, workflow.ErrRunNotResumable):
		return fmt.Errorf("%w (see \"stepwise runs show %s\")", err, key)
	case err != nil:
		return err
	}
	// Descendants that stopped after the run ended are news nobody decided on: say so.
	left := append([]string{}, res.LeftAsTheyAre...) // [] rather than null in JSON
	if f.json {
		return c.printJSON(map[string]any{"key": key, "resumed": true, "actor": a.actor, "reason": a.reason, "left_as_they_are": left})
	}
	fmt.Fprintf(c.stdout, "run %s resumed from its last checkpoint by %s (%q); your service's workers pick it up. Follow it with: stepwise runs show %s\n", key, a.actor, a.reason, key)
	if len(left) > 0 {
		fmt.Fprintf(c.stdout, "left as they are (failed or cancelled after the run ended; a parent waiting for them goes on without them: resume each on its own if that is the decision): %s\n", strings.Join(left, ", "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func derefInt(n *int) int {
	if n == nil {
		return 0
	}
	return *n
}

// ts formats a time in UTC to the second.
func ts(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

func tsp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return ts(*t)
}

// oneLine keeps text on one table line: control characters shown escaped, cut at max runes.
func oneLine(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			fmt.Fprintf(&b, "%U", r)
			continue
		}
		b.WriteRune(r)
	}
	if r := []rune(b.String()); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return b.String()
}

// nonNil makes an empty list print as [] in JSON.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// runJSON is a run in snake_case for scripts.
type runJSON struct {
	Key               string              `json:"key"`
	Workflow          string              `json:"workflow"`
	Input             json.RawMessage     `json:"input"`
	Status            workflow.RunStatus  `json:"status"`
	Version           int64               `json:"version"`
	Schedule          *string             `json:"schedule,omitempty"`
	Slot              *time.Time          `json:"slot,omitempty"`
	Shard             *int                `json:"shard,omitempty"`
	RiverJobID        *int64              `json:"river_job_id,omitempty"`
	Claims            int                 `json:"claims"`
	Failures          int                 `json:"failures"`
	FailuresInARow    int                 `json:"failures_in_a_row"`
	Retry             *workflow.Retry     `json:"retry,omitempty"`
	LastError         *string             `json:"last_error,omitempty"`
	WakeAt            *time.Time          `json:"wake_at,omitempty"`
	CancelRequestedAt *time.Time          `json:"cancel_requested_at,omitempty"`
	CreatedAt         time.Time           `json:"created_at"`
	UpdatedAt         time.Time           `json:"updated_at"`
	FinishedAt        *time.Time          `json:"finished_at,omitempty"`
	HistoryPrunedAt   *time.Time          `json:"history_pruned_at,omitempty"`
	Awaiting          *workflow.Awaiting  `json:"awaiting,omitempty"`
	Parent            *string             `json:"parent,omitempty"`
	Wait              *workflow.WaitState `json:"wait,omitempty"`
}

func toRunJSON(r *workflow.Run) runJSON {
	return runJSON{Key: r.Key, Workflow: r.Workflow, Input: r.Input, Status: r.Status, Version: r.Version, Schedule: r.Schedule,
		Slot: r.Slot, Shard: r.Shard, RiverJobID: r.RiverJobID, Claims: r.Attempts, Failures: r.Failures, FailuresInARow: r.FailuresInARow,
		Retry: r.Retry, LastError: r.LastError, WakeAt: r.WakeAt, CancelRequestedAt: r.CancelRequestedAt, CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt, HistoryPrunedAt: r.HistoryPrunedAt, Awaiting: r.Awaiting,
		Parent: r.Parent, Wait: r.Wait}
}

// resumable reports whether a run in status s can be resumed: failed or cancelled.
func resumable(s workflow.RunStatus) bool {
	return s == workflow.RunStatusFailed || s == workflow.RunStatusCancelled
}
