package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	wfengine "github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
)

// countCap bounds every count on the overview: counting a state with millions of rows costs
// a scan of them; "10,000+" tells an operator as much.
const countCap = 10000

// eventRow is one row of stepwise_event.
type eventRow struct {
	ID        int64
	Subject   string
	Kind      string
	FromState string
	ToState   string
	Actor     string
	Token     *int64
	Attempt   *int
	Detail    string
	At        time.Time
}

const eventColumns = `id, subject, kind, coalesce(from_state, ''), coalesce(to_state, ''), coalesce(actor, ''), token, attempt, coalesce(detail::text, ''), at`

func scanEvents(rows pgx.Rows) ([]eventRow, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventRow, error) {
		var e eventRow
		err := r.Scan(&e.ID, &e.Subject, &e.Kind, &e.FromState, &e.ToState, &e.Actor, &e.Token, &e.Attempt, &e.Detail, &e.At)
		return e, err
	})
}

// kinds lists the operation kinds present, by a loose index scan of (kind, business_key): one
// index probe per kind, however many operations there are (SELECT DISTINCT would read them
// all).
func (h *handler) kinds(ctx context.Context) ([]string, error) {
	rows, err := h.db.Query(ctx, `
		WITH RECURSIVE k AS (
			(SELECT kind FROM stepwise_operation ORDER BY kind LIMIT 1)
			UNION ALL
			SELECT (SELECT o.kind FROM stepwise_operation o WHERE o.kind > k.kind ORDER BY o.kind LIMIT 1) FROM k WHERE k.kind IS NOT NULL
		)
		SELECT kind FROM k WHERE kind IS NOT NULL LIMIT 100`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// --- overview ---

type kindSummary struct {
	Kind          string
	Counts        map[string]int // capped at countCap+1
	OldestUnknown *time.Time
	OldestPending *time.Time
}

type scheduleSummary struct {
	Name, Spec, Zone string
	Paused           bool
	Slots            []*schedule.SlotReport
}

type overviewData struct {
	Schedules []scheduleSummary
	Kinds     []kindSummary
	States    []string
	Runs      map[string]int
	Sleeping  int
	Held      int
	// Retrying are the runs waiting for a retry after failing, most failures in a row
	// first (a crash-loop signal), and RetryingTotal how many there are.
	Retrying      []*workflow.Run
	RetryingTotal int
	// Waiting counts the runs that wait, by kind of wait.
	Waiting []waitingCount
	Recent  []eventRow
	Now     time.Time
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request, v *viewer) {
	if err := onlyParams(r.URL.Query()); err != nil {
		h.badRequest(w, r, err)
		return
	}
	ctx := r.Context()
	d := &overviewData{Runs: map[string]int{}, Now: time.Now()}
	for _, s := range outbox.States() {
		d.States = append(d.States, string(s))
	}

	// Schedules: the latest slots of each, with the batch status derived from evidence
	// (stepwise.Client.SlotList: the slot's runs and the operations they enqueued).
	rows, err := h.db.Query(ctx, `SELECT name, spec, zone, paused FROM stepwise_schedule ORDER BY name LIMIT 50`)
	if err != nil {
		h.internal(w, r, "reading schedules", err)
		return
	}
	d.Schedules, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (scheduleSummary, error) {
		var s scheduleSummary
		err := r.Scan(&s.Name, &s.Spec, &s.Zone, &s.Paused)
		return s, err
	})
	if err != nil {
		h.internal(w, r, "reading schedules", err)
		return
	}
	for i := range d.Schedules {
		if d.Schedules[i].Slots, err = h.latestSlots(ctx, d.Schedules[i].Name, 5); err != nil {
			h.internal(w, r, "reading slots", err)
			return
		}
	}

	kinds, err := h.kinds(ctx)
	if err != nil {
		h.internal(w, r, "listing operation kinds", err)
		return
	}
	if len(kinds) > 0 {
		// Counts per kind and state, each capped: at most countCap+1 entries of
		// stepwise_operation_console_state_idx (kind, state, ...) per cell.
		rows, err = h.db.Query(ctx, `SELECT k.kind, s.state,
				(SELECT count(*) FROM (SELECT 1 FROM stepwise_operation o WHERE o.state = s.state AND o.kind = k.kind LIMIT $3) x)::int
			FROM unnest($1::text[]) k(kind) CROSS JOIN unnest($2::text[]) s(state)`, kinds, d.States, countCap+1)
		if err != nil {
			h.internal(w, r, "counting operations", err)
			return
		}
		byKind := map[string]*kindSummary{}
		for _, k := range kinds {
			d.Kinds = append(d.Kinds, kindSummary{Kind: k, Counts: map[string]int{}})
		}
		for i := range d.Kinds {
			byKind[d.Kinds[i].Kind] = &d.Kinds[i]
		}
		var kind, state string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&kind, &state, &n}, func() error {
			byKind[kind].Counts[state] = n
			return nil
		}); err != nil {
			h.internal(w, r, "counting operations", err)
			return
		}
		// Ages: the oldest PENDING by created_at is the first entry of its (kind, state) range
		// of the state index; the oldest UNKNOWN_EXTERNAL reads the rows of the partial
		// unknown index (few, unless the external system is down: then it is the point).
		rows, err = h.db.Query(ctx, `SELECT k.kind,
				(SELECT min(unknown_since) FROM stepwise_operation o WHERE o.state = 'UNKNOWN_EXTERNAL' AND o.kind = k.kind),
				(SELECT created_at FROM stepwise_operation o WHERE o.state = 'PENDING' AND o.kind = k.kind ORDER BY created_at LIMIT 1)
			FROM unnest($1::text[]) k(kind)`, kinds)
		if err != nil {
			h.internal(w, r, "reading operation ages", err)
			return
		}
		var unknown, pending *time.Time
		if _, err := pgx.ForEachRow(rows, []any{&kind, &unknown, &pending}, func() error {
			byKind[kind].OldestUnknown, byKind[kind].OldestPending = unknown, pending
			return nil
		}); err != nil {
			h.internal(w, r, "reading operation ages", err)
			return
		}
	}

	// Runs by status: stepwise_run_console_status_idx per status, capped. Sleeping: an
	// unfinished run whose lease nobody holds (snoozed between steps, or waiting for a
	// worker); held: one a worker is stepping now (stepwise_run_active_idx).
	rows, err = h.db.Query(ctx, `SELECT s.status,
			(SELECT count(*) FROM (SELECT 1 FROM stepwise_run r WHERE r.status = s.status LIMIT $2) x)::int
		FROM unnest($1::text[]) s(status)`, runStatuses, countCap+1)
	if err != nil {
		h.internal(w, r, "counting runs", err)
		return
	}
	var status string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error { d.Runs[status] = n; return nil }); err != nil {
		h.internal(w, r, "counting runs", err)
		return
	}
	if err := h.db.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE c.lease_until IS NOT NULL AND c.lease_until > now())::int,
			count(*) FILTER (WHERE c.lease_until IS NULL OR c.lease_until <= now())::int
		FROM stepwise_run r JOIN stepwise_checkpoint c ON c.key = r.key
		WHERE r.status IN ('pending', 'running')`).Scan(&d.Held, &d.Sleeping); err != nil {
		h.internal(w, r, "counting runs", err)
		return
	}

	// Runs waiting for a retry, the crash-loop signal (the engine's Retrying: unfinished runs
	// with failures and the runs of River's retryable jobs, by their indexes).
	if d.Retrying, d.RetryingTotal, err = wfengine.Retrying(ctx, h.db, 10); err != nil {
		h.internal(w, r, "listing retrying runs", err)
		return
	}

	// Runs that wait (workflow.WaitFor...), by kind, and those a MANUAL operation holds up.
	if d.Waiting, err = h.waitingCounts(ctx); err != nil {
		h.internal(w, r, "counting waiting runs", err)
		return
	}

	// Recent takeovers and fenced (refused) commits: stepwise_event_console_kind_idx.
	rows, err = h.db.Query(ctx, `SELECT `+eventColumns+` FROM (
			(SELECT * FROM stepwise_event WHERE kind = 'run.takeover' ORDER BY id DESC LIMIT 10)
			UNION ALL
			(SELECT * FROM stepwise_event WHERE kind = 'lease.fenced' ORDER BY id DESC LIMIT 10)
		) e ORDER BY id DESC LIMIT 10`)
	if err != nil {
		h.internal(w, r, "reading takeovers", err)
		return
	}
	if d.Recent, err = scanEvents(rows); err != nil {
		h.internal(w, r, "reading takeovers", err)
		return
	}
	h.render(w, r, v, "overview", "Overview", d)
}

// --- runs ---

// runRow is a run with its checkpoint.
type runRow struct {
	workflow.Run
	Cursor     string
	Owner      string
	LeaseUntil *time.Time
	Token      int64
	Steps      int64
	// Waiting is the kind of the run's wait, while it waits (the runs list's line; the run
	// page reads the whole wait, Run.Wait).
	Waiting workflow.WaitKind
}

// Held reports whether a worker holds the run's lease now.
func (r *runRow) Held() bool { return r.LeaseUntil != nil && r.LeaseUntil.After(time.Now()) }

const runColumns = `r.key, r.workflow, r.input, r.status, r.schedule, r.slot, r.shard, r.river_job_id, r.attempts, r.last_error,
	r.created_at, r.updated_at, r.finished_at, r.cancel_requested_at, r.version,
	coalesce(c.cursor::text, ''), coalesce(c.owner, ''), c.lease_until, coalesce(c.fencing_token, 0), coalesce(c.steps, 0), coalesce(w.kind, '')`

// runJoins joins a run r with its checkpoint c and its open wait w (primary keys).
const runJoins = ` LEFT JOIN stepwise_checkpoint c ON c.key = r.key LEFT JOIN stepwise_wait w ON w.run_key = r.key AND ` + waitingSQL

func scanRun(row pgx.Row) (*runRow, error) {
	var x runRow
	var input []byte
	err := row.Scan(&x.Key, &x.Workflow, &input, &x.Status, &x.Schedule, &x.Slot, &x.Shard, &x.RiverJobID, &x.Attempts, &x.LastError,
		&x.CreatedAt, &x.UpdatedAt, &x.FinishedAt, &x.CancelRequestedAt, &x.Version, &x.Cursor, &x.Owner, &x.LeaseUntil, &x.Token, &x.Steps, &x.Waiting)
	x.Input = json.RawMessage(input)
	return &x, err
}

type runsData struct {
	Filter   *runFilter
	Statuses []string
	Waits    []string
	Runs     []*runRow
	Next     template.URL
}

func (h *handler) runs(w http.ResponseWriter, r *http.Request, v *viewer) {
	f, err := parseRunFilter(r.URL.Query())
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	// Newest first, keyset on (created_at, key). With a status: one range of
	// stepwise_run_console_status_idx (status, created_at, key). Without: the same index,
	// one range per status merged (runs are written per step, not per item, so an index
	// on created_at alone would buy little). Schedule: stepwise_run_slot_idx. Workflow is
	// a filter on those scans.
	var conds []string
	args := []any{}
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	if f.Workflow != "" {
		conds = append(conds, "r.workflow = "+arg(f.Workflow))
	}
	if f.Schedule != "" {
		conds = append(conds, "r.schedule = "+arg(f.Schedule))
	}
	if f.After != nil {
		conds = append(conds, "(r.created_at, r.key) < ("+arg(f.After.At)+"::timestamptz, "+arg(f.After.Key)+"::text)")
	}
	limit := arg(h.cfg.PageSize + 1)
	statuses := runStatuses
	if f.Status != "" {
		statuses = []string{f.Status}
	}
	// Each status's page of runs first, then their checkpoints by primary key: joining
	// before the LIMIT would read every checkpoint of the history.
	var parts []string
	if f.Wait != "" {
		// The waiting runs: from their open waits (one row each, however long the history),
		// sorted; a wait has no index by kind, so this reads every open wait.
		c := append([]string{waitingSQL}, conds...)
		if f.Status != "" {
			c = append(c, "r.status = '"+f.Status+"'") // one of runStatuses
		}
		if f.Wait == waitManual {
			c = append(c, manualBlockSQL)
		} else {
			c = append(c, "w.kind = "+arg(f.Wait))
		}
		parts = append(parts, `(SELECT r.* FROM stepwise_wait w JOIN stepwise_run r ON r.key = w.run_key WHERE `+strings.Join(c, " AND ")+
			` ORDER BY r.created_at DESC, r.key DESC LIMIT `+limit+`)`)
		statuses = nil
	}
	for _, s := range statuses {
		c := append([]string{"r.status = '" + s + "'"}, conds...) // s is one of runStatuses
		parts = append(parts, `(SELECT r.* FROM stepwise_run r WHERE `+strings.Join(c, " AND ")+
			` ORDER BY r.created_at DESC, r.key DESC LIMIT `+limit+`)`)
	}
	sql := `SELECT ` + runColumns + ` FROM (` + strings.Join(parts, " UNION ALL ") + `) r` + runJoins +
		` ORDER BY r.created_at DESC, r.key DESC LIMIT ` + limit
	rows, err := h.db.Query(r.Context(), sql, args...)
	if err != nil {
		h.internal(w, r, "listing runs", err)
		return
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*runRow, error) { return scanRun(row) })
	if err != nil {
		h.internal(w, r, "listing runs", err)
		return
	}
	d := &runsData{Filter: f, Statuses: runStatuses, Waits: waitFilters, Runs: list}
	if len(list) > h.cfg.PageSize {
		last := list[h.cfg.PageSize-1]
		d.Runs = list[:h.cfg.PageSize]
		q := f.query()
		q.Set("after", pageCursor{At: last.CreatedAt, Key: last.Key}.encode())
		d.Next = template.URL(q.Encode())
	}
	h.render(w, r, v, "runs", "Runs", d)
}

type runData struct {
	Run        *runRow
	Wait       *waitView
	Family     *family
	Events     []eventRow
	Next       template.URL
	CanCancel  bool
	CanResume  bool
	Operations template.URL // query of the run's operations list
	// Left is what the run's latest resume left as it was, when that resume is on the
	// events' first page (right after a resume, always).
	Left *leftView
}

// leftView is the descendants a resume left as they were (they failed or were cancelled
// after the run ended: news the person who resumed had not seen), with their status now.
type leftView struct {
	Actor string
	At    time.Time
	Runs  []leftRun
	More  int
}

type leftRun struct {
	Key    string
	Status string
}

// maxLeftShown bounds the left descendants the run page names; the event lists them all.
const maxLeftShown = 20

// leftByResume reads what the newest run.resume event among events (newest first) left as
// it was, with each such run's status now; nil when that event left nothing. Guards against
// a person resuming a parent and believing the whole tree runs again: the descendants that
// changed on their own stay failed or cancelled until someone resumes each.
func (h *handler) leftByResume(ctx context.Context, events []eventRow) (*leftView, error) {
	for _, e := range events {
		if e.Kind != "run.resume" {
			continue
		}
		var d struct {
			Left []string `json:"left_as_they_are"`
		}
		if err := json.Unmarshal([]byte(e.Detail), &d); err != nil || len(d.Left) == 0 {
			return nil, nil //nolint:nilerr // an event without the list left nothing
		}
		lv := &leftView{Actor: e.Actor, At: e.At}
		keys := d.Left
		if len(keys) > maxLeftShown {
			lv.More, keys = len(keys)-maxLeftShown, keys[:maxLeftShown]
		}
		status := make(map[string]string, len(keys))
		rows, err := h.db.Query(ctx, `SELECT key, status FROM stepwise_run WHERE key = ANY($1)`, keys)
		if err != nil {
			return nil, err
		}
		var k, st string
		if _, err := pgx.ForEachRow(rows, []any{&k, &st}, func() error { status[k] = st; return nil }); err != nil {
			return nil, err
		}
		for _, k := range keys {
			st, ok := status[k]
			if !ok {
				st = "pruned"
			}
			lv.Runs = append(lv.Runs, leftRun{Key: k, Status: st})
		}
		return lv, nil
	}
	return nil, nil
}

func (h *handler) run(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := r.URL.Query()
	if err := onlyParams(q, "key", "before"); err != nil {
		h.badRequest(w, r, err)
		return
	}
	key := q.Get("key")
	if key == "" {
		h.fail(w, r, http.StatusBadRequest, "key is required: the run's key, as listed on %s/runs", h.cfg.Prefix)
		return
	}
	if err := textParam("key", key, 255); err != nil {
		h.badRequest(w, r, err)
		return
	}
	before, err := beforeParam(q)
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	ctx := r.Context()
	run, err := scanRun(h.db.QueryRow(ctx, `SELECT `+runColumns+` FROM stepwise_run r`+runJoins+` WHERE r.key = $1`, key))
	if errors.Is(err, pgx.ErrNoRows) {
		h.fail(w, r, http.StatusNotFound, "no run with key %q: see %s/runs", key, h.cfg.Prefix)
		return
	}
	if err != nil {
		h.internal(w, r, "reading the run", err)
		return
	}
	// The event trail, newest first, keyset on id: stepwise_event_subject_idx (subject, id).
	rows, err := h.db.Query(ctx, `SELECT `+eventColumns+` FROM stepwise_event WHERE subject = $1 AND id < $2 ORDER BY id DESC LIMIT $3`,
		key, before, h.cfg.PageSize+1)
	if err != nil {
		h.internal(w, r, "reading the run's events", err)
		return
	}
	events, err := scanEvents(rows)
	if err != nil {
		h.internal(w, r, "reading the run's events", err)
		return
	}
	// Its derived retry state (failures in a row, next try): workflow's own reader.
	state, err := wfengine.GetRun(ctx, h.db, key)
	if err != nil {
		h.internal(w, r, "reading the run's retry state", err)
		return
	}
	run.FailuresInARow, run.Retry = state.FailuresInARow, state.Retry
	// Its wait and parent: the same reader (the text the command prints, too).
	d := &runData{Run: run, Events: events, Wait: newWaitView(key, state.Wait, time.Now())}
	if d.Family, err = h.family(ctx, key, state.Parent); err != nil {
		h.internal(w, r, "reading the run's family", err)
		return
	}
	if len(events) > h.cfg.PageSize {
		d.Events = events[:h.cfg.PageSize]
		d.Next = template.URL(url.Values{"key": {key}, "before": {strconv.FormatInt(d.Events[len(d.Events)-1].ID, 10)}}.Encode())
	}
	unfinished := run.Status == workflow.RunStatusPending || run.Status == workflow.RunStatusRunning
	d.CanCancel = v.CanAct() && h.cfg.Client != nil && unfinished && run.CancelRequestedAt == nil
	d.CanResume = v.CanAct() && h.canResume() && (run.Status == workflow.RunStatusFailed || run.Status == workflow.RunStatusCancelled)
	d.Operations = template.URL(url.Values{"run": {key}}.Encode())
	if q.Get("before") == "" {
		if d.Left, err = h.leftByResume(ctx, d.Events); err != nil {
			h.internal(w, r, "reading what the run's resume left", err)
			return
		}
	}
	h.render(w, r, v, "run", "Run "+key, d)
}

// --- operations ---

type operationsData struct {
	Filter     *opFilter
	States     []string
	Kinds      []string
	Operations []*outbox.Operation
	Next       template.URL
}

func (h *handler) operations(w http.ResponseWriter, r *http.Request, v *viewer) {
	f, err := parseOpFilter(r.URL.Query())
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	ctx := r.Context()
	kinds, err := h.kinds(ctx)
	if err != nil {
		h.internal(w, r, "listing operation kinds", err)
		return
	}
	// Newest first, keyset on (created_at, operation_id); each filter has its index:
	//   business key: the unique (kind, business_key) index, per kind (at most one row each);
	//   run (+state): stepwise_operation_console_run_idx (run_key, state, created_at, operation_id);
	//                 a run alone: one range per state, merged;
	//   kind + state: stepwise_operation_console_state_idx (kind, state, created_at, operation_id);
	//   state:        the same index, one range per kind, merged;
	//   kind:         the same index, one range per state, merged;
	//   nothing:      the same index, one range per kind and state, merged.
	// (No index on (kind, created_at): every index is written on each state change, on the
	// delivery path; migration 016.)
	// Each branch reads at most a page (plus one) of index entries, however large the ledger.
	var conds []string
	args := []any{}
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	if f.BusinessKey != "" {
		ks := kinds
		if f.Kind != "" {
			ks = []string{f.Kind}
		}
		conds = append(conds, "(o.kind, o.business_key) IN (SELECT k, "+arg(f.BusinessKey)+"::text FROM unnest("+arg(ks)+"::text[]) k)")
	}
	if f.Kind != "" {
		conds = append(conds, "o.kind = "+arg(f.Kind))
	}
	if f.Run != "" {
		conds = append(conds, "o.run_key = "+arg(f.Run))
	}
	if f.State != "" {
		conds = append(conds, "o.state = "+arg(f.State))
	}
	if f.After != nil {
		id, _ := uuid.Parse(f.After.Key) // validated by parseOpFilter
		at := arg(f.After.At)
		// The plain bound lets an index on created_at alone (without the id) start at the
		// cursor; the row comparison then breaks ties exactly.
		conds = append(conds, "o.created_at <= "+at+"::timestamptz",
			"(o.created_at, o.operation_id) < ("+at+"::timestamptz, "+arg(id)+"::uuid)")
	}
	limit := arg(h.cfg.PageSize + 1)
	// branches are the extra conditions of each merged range: one per kind where none was
	// given, times one per state where none was given (a business key needs neither).
	branches := [][]string{nil}
	if f.BusinessKey == "" && f.Run == "" && f.Kind == "" {
		branches = nil
		for _, k := range kinds {
			branches = append(branches, []string{"o.kind = " + arg(k)})
		}
	}
	if f.BusinessKey == "" && f.State == "" {
		var perState [][]string
		for _, b := range branches {
			for _, st := range outbox.States() {
				perState = append(perState, append(append([]string{}, b...), "o.state = '"+string(st)+"'")) // a constant
			}
		}
		branches = perState
	}
	var parts []string
	for _, extra := range branches {
		c := append(append([]string{}, extra...), conds...)
		where := "true"
		if len(c) > 0 {
			where = strings.Join(c, " AND ")
		}
		parts = append(parts, `(SELECT `+outbox.Columns("o")+` FROM stepwise_operation o WHERE `+where+
			` ORDER BY o.created_at DESC, o.operation_id DESC LIMIT `+limit+`)`)
	}
	var sql string
	switch len(parts) {
	case 0: // no operation at all yet: a query with no parameters, so no arguments either
		sql, args = `SELECT `+outbox.Columns("o")+` FROM stepwise_operation o WHERE false`, nil
	case 1:
		sql = parts[0]
	default:
		sql = `SELECT * FROM (` + strings.Join(parts, " UNION ALL ") + `) u ORDER BY created_at DESC, operation_id DESC LIMIT ` + limit
	}
	rows, err := h.db.Query(ctx, sql, args...)
	if err != nil {
		h.internal(w, r, "listing operations", err)
		return
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*outbox.Operation, error) { return outbox.ScanOperation(row) })
	if err != nil {
		h.internal(w, r, "listing operations", err)
		return
	}
	d := &operationsData{Filter: f, Kinds: kinds, Operations: list}
	for _, s := range outbox.States() {
		d.States = append(d.States, string(s))
	}
	if len(list) > h.cfg.PageSize {
		last := list[h.cfg.PageSize-1]
		d.Operations = list[:h.cfg.PageSize]
		q := f.query()
		q.Set("after", pageCursor{At: last.CreatedAt, Key: last.ID.String()}.encode())
		d.Next = template.URL(q.Encode())
	}
	h.render(w, r, v, "operations", "Operations", d)
}

type operationData struct {
	Op         *outbox.Operation
	Payload    string
	Events     []eventRow
	Requests   []request
	HasReqs    bool
	CanResolve bool
	Outcomes   []string
}

func (h *handler) operation(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := r.URL.Query()
	if err := onlyParams(q, "id"); err != nil {
		h.badRequest(w, r, err)
		return
	}
	id, err := uuid.Parse(q.Get("id"))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "id=%.60q: want an operation_id (a UUID), as listed on %s/operations", q.Get("id"), h.cfg.Prefix)
		return
	}
	ctx := r.Context()
	op, err := outbox.Get(ctx, h.db, id)
	if errors.Is(err, stepwisetype.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "no operation %s: see %s/operations", id, h.cfg.Prefix)
		return
	}
	if err != nil {
		h.internal(w, r, "reading the operation", err)
		return
	}
	// Audit rows: stepwise_event_subject_idx; an operation has a handful (one per move).
	rows, err := h.db.Query(ctx, `SELECT `+eventColumns+` FROM stepwise_event WHERE subject = $1 ORDER BY id LIMIT 500`, "op:"+id.String())
	if err != nil {
		h.internal(w, r, "reading the operation's audit rows", err)
		return
	}
	d := &operationData{Op: op, Payload: string(op.Payload)}
	if d.Events, err = scanEvents(rows); err != nil {
		h.internal(w, r, "reading the operation's audit rows", err)
		return
	}
	if h.cfg.Client != nil {
		d.HasReqs = true
		if d.Requests, err = h.requests(ctx, id); err != nil {
			h.internal(w, r, "reading the operation's requests", err)
			return
		}
	}
	d.CanResolve = v.CanAct() && h.canResolveKind(op.Kind) && op.State == outbox.StateManual
	d.Outcomes = []string{string(outbox.StateSucceeded), string(outbox.StateFailedPermanent), string(outbox.StateRetryable)}
	h.render(w, r, v, "operation", "Operation "+id.String(), d)
}

// --- totals ---

const (
	// defaultTotalsTimeout is Config.TotalsTimeout's default: below the 30 s WriteTimeout of
	// the sample's serve, with room to render the answer.
	defaultTotalsTimeout = 20 * time.Second
	// totalsTTL is how long a comparison is served again for the same kind and date without
	// asking the external system for its statement again: reloads and several operators
	// opening the page together cost one statement read.
	totalsTTL = 15 * time.Second
	// maxCachedTotals bounds the comparisons kept; each holds at most totalsDifferences
	// differences of each kind, never a day's operations or statement.
	maxCachedTotals = 32
	// totalsDifferences is the differences of each kind listed on the page; the rest are
	// counted.
	totalsDifferences = 200
	// firstTotalsDay is the earliest date the page accepts: an earlier one is a typo (0001,
	// 1899), not a day anyone settled on.
	firstTotalsDay = "2000-01-01"
)

// totalsGate lets one Totals comparison run at a time and keeps each for totalsTTL. A
// comparison reads the external statement and a whole day of the ledger: several at once
// would take the database connections and the CPU every other page needs, and behind the
// sample's in-flight cap of 4 four of them would hold every slot. A request that finds one
// running is answered 503 at once (it does not wait holding a slot); its retry finds the
// result kept when it asked for the same kind and date.
type totalsGate struct {
	slot chan struct{}

	mu      sync.Mutex
	running string // kind and date of the comparison running
	since   time.Time
	kept    map[string]keptTotals
}

type keptTotals struct {
	t  *reconcile.Totals
	at time.Time
}

func newTotalsGate() *totalsGate {
	return &totalsGate{slot: make(chan struct{}, 1), kept: map[string]keptTotals{}}
}

// get returns the comparison kept for key, if it is younger than totalsTTL.
func (g *totalsGate) get(key string, now time.Time) (keptTotals, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k, ok := g.kept[key]
	if !ok || now.Sub(k.at) >= totalsTTL {
		return keptTotals{}, false
	}
	return k, true
}

// keep stores a comparison, dropping expired ones and, past maxCachedTotals, the oldest.
func (g *totalsGate) keep(key string, k keptTotals) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for kk, v := range g.kept {
		if k.at.Sub(v.at) >= totalsTTL {
			delete(g.kept, kk)
		}
	}
	for len(g.kept) >= maxCachedTotals {
		oldest := ""
		for kk, v := range g.kept {
			if oldest == "" || v.at.Before(g.kept[oldest].at) {
				oldest = kk
			}
		}
		delete(g.kept, oldest)
	}
	g.kept[key] = k
}

// acquire takes the slot without waiting; on false, it names the comparison holding it.
func (g *totalsGate) acquire(what string, now time.Time) (ok bool, running string, since time.Duration) {
	select {
	case g.slot <- struct{}{}:
		g.mu.Lock()
		g.running, g.since = what, now
		g.mu.Unlock()
		return true, "", 0
	default:
		g.mu.Lock()
		defer g.mu.Unlock()
		return false, g.running, now.Sub(g.since)
	}
}

func (g *totalsGate) release() {
	g.mu.Lock()
	g.running = ""
	g.mu.Unlock()
	<-g.slot
}

type totalsData struct {
	Kinds      []string
	Kind       string
	Date       string
	Zone       string
	Totals     *reconcile.Totals
	ComputedAt time.Time
	KeptFor    time.Duration
	Rows       []totalsRow
	Counts     []differenceCount
	Shown      []reconcile.Difference
	More       int
}

type totalsRow struct {
	Currency    string
	Here, There reconcile.Sum
	Differs     bool
}

type differenceCount struct {
	Kind  reconcile.DifferenceKind
	Count int
}

func (h *handler) totals(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := r.URL.Query()
	if err := onlyParams(q, "kind", "date"); err != nil {
		h.badRequest(w, r, err)
		return
	}
	d := &totalsData{Kind: q.Get("kind"), Date: q.Get("date"), Zone: h.cfg.Location.String(), KeptFor: totalsTTL}
	for k := range h.cfg.Statements {
		d.Kinds = append(d.Kinds, k)
	}
	sort.Strings(d.Kinds)
	if len(d.Kinds) == 0 {
		h.fail(w, r, http.StatusNotFound, "totals are not configured: give each kind its external statement (stepwise.KindConfig.Statement of the console's client, or console.Config.Statements)")
		return
	}
	if d.Kind == "" && d.Date == "" {
		d.Kind = d.Kinds[0]
		h.render(w, r, v, "totals", "Totals", d)
		return
	}
	stmt, ok := h.cfg.Statements[d.Kind]
	if !ok {
		h.fail(w, r, http.StatusBadRequest, "kind=%.60q has no statement configured: want one of %s", d.Kind, strings.Join(d.Kinds, ", "))
		return
	}
	day, err := time.ParseInLocation("2006-01-02", d.Date, h.cfg.Location)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "date=%.40q: want a day as YYYY-MM-DD, such as 2026-03-01", d.Date)
		return
	}
	// A day nothing can have been sent on is a typo: asking the bank for the statement of
	// year 1 or 9999 costs a statement read for nothing (and year 1 is outside what the
	// database's timestamps take).
	first, _ := time.ParseInLocation("2006-01-02", firstTotalsDay, h.cfg.Location)
	now := time.Now()
	tomorrow := time.Date(now.In(h.cfg.Location).Year(), now.In(h.cfg.Location).Month(), now.In(h.cfg.Location).Day()+1, 0, 0, 0, 0, h.cfg.Location)
	if day.Before(first) || day.After(tomorrow) {
		h.fail(w, r, http.StatusBadRequest, "date=%.40q: want a day from %s to tomorrow (%s, %s): nothing can have been sent on another",
			d.Date, firstTotalsDay, tomorrow.Format("2006-01-02"), h.cfg.Location)
		return
	}
	key := d.Kind + "\x00" + d.Date
	if k, ok := h.totalsGate.get(key, now); ok {
		h.renderTotals(w, r, v, d, k)
		return
	}
	// One comparison at a time, never waited for: see totalsGate.
	acquired, running, since := h.totalsGate.acquire(d.Kind+" on "+d.Date, now)
	if !acquired {
		w.Header().Set("Retry-After", "3")
		h.fail(w, r, http.StatusServiceUnavailable, "another Totals comparison is running (%s, for %s): one runs at a time so that the other pages stay responsive; reload in a few seconds (a comparison is kept for %s, so the reload after it is instant)",
			running, since.Round(100*time.Millisecond), totalsTTL)
		return
	}
	defer h.totalsGate.release()
	// The comparison that held the slot may have been this one.
	if k, ok := h.totalsGate.get(key, time.Now()); ok {
		h.renderTotals(w, r, v, d, k)
		return
	}
	// Bounded below the server's write timeout: past it the answer would be lost, and the
	// operator would see a dropped connection instead of the reason.
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.TotalsTimeout)
	defer cancel()
	start := time.Now()
	t, err := reconcile.CompareTotals(ctx, h.db, stmt, &reconcile.TotalsParams{Kind: d.Kind, From: day, To: day.AddDate(0, 0, 1),
		MaxDifferences: totalsDifferences})
	if err != nil {
		ref := h.errSeq.Add(1)
		h.logger.Error("console: comparing totals", "ref", ref, "kind", d.Kind, "date", d.Date, "took", time.Since(start), "error", err)
		if errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil {
			h.fail(w, r, http.StatusServiceUnavailable, "comparing totals was stopped after %s (Config.TotalsTimeout; reference %d): the statement or the ledger took too long to read; the details are in the server's log",
				h.cfg.TotalsTimeout, ref)
			return
		}
		// The statement comes from another system: its failure is not ours to detail.
		h.fail(w, r, http.StatusBadGateway, "comparing totals failed (reference %d): the statement or the ledger could not be read; the details are in the server's log", ref)
		return
	}
	k := keptTotals{t: t, at: time.Now()}
	h.totalsGate.keep(key, k)
	h.renderTotals(w, r, v, d, k)
}

func (h *handler) renderTotals(w http.ResponseWriter, r *http.Request, v *viewer, d *totalsData, k keptTotals) {
	t := k.t
	d.Totals, d.ComputedAt = t, k.at
	cur := map[string]bool{}
	for c := range t.Here {
		cur[c] = true
	}
	for c := range t.There {
		cur[c] = true
	}
	for c := range cur {
		d.Rows = append(d.Rows, totalsRow{Currency: c, Here: t.Here[c], There: t.There[c], Differs: t.Here[c] != t.There[c]})
	}
	sort.Slice(d.Rows, func(i, j int) bool { return d.Rows[i].Currency < d.Rows[j].Currency })
	for _, kind := range []reconcile.DifferenceKind{reconcile.DifferenceAmountDiffers, reconcile.DifferenceOnlyHere, reconcile.DifferenceDuplicate, reconcile.DifferenceOnlyThere} {
		if n := t.Counts[kind]; n > 0 {
			d.Counts = append(d.Counts, differenceCount{Kind: kind, Count: n})
		}
	}
	d.Shown, d.More = t.Differences, t.Omitted()
	h.render(w, r, v, "totals", "Totals", d)
}

// --- audit ---

type auditData struct {
	Events []eventRow
	Next   template.URL
}

func (h *handler) audit(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := r.URL.Query()
	if err := onlyParams(q, "before"); err != nil {
		h.badRequest(w, r, err)
		return
	}
	before, err := beforeParam(q)
	if err != nil {
		h.badRequest(w, r, err)
		return
	}
	// stepwise_event_console_kind_idx (kind, id), partial on the console's own kind.
	rows, err := h.db.Query(r.Context(), `SELECT `+eventColumns+` FROM stepwise_event WHERE kind = 'console.action' AND id < $1 ORDER BY id DESC LIMIT $2`,
		before, h.cfg.PageSize+1)
	if err != nil {
		h.internal(w, r, "reading the audit trail", err)
		return
	}
	events, err := scanEvents(rows)
	if err != nil {
		h.internal(w, r, "reading the audit trail", err)
		return
	}
	d := &auditData{Events: events}
	if len(events) > h.cfg.PageSize {
		d.Events = events[:h.cfg.PageSize]
		d.Next = template.URL(url.Values{"before": {strconv.FormatInt(d.Events[len(d.Events)-1].ID, 10)}}.Encode())
	}
	h.render(w, r, v, "audit", "Console actions", d)
}

func (h *handler) badRequest(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errBadInput) {
		h.fail(w, r, http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), errBadInput.Error()+": "))
		return
	}
	h.internal(w, r, "reading the request", fmt.Errorf("unexpected: %w", err))
}

// latestSlots reports the newest n slots of a schedule with their batch status derived from
// evidence by schedule.DeriveBatchStatus, as stepwise.Client.SlotList does, except that operations
// are counted up to countCap per state: SlotList counts every operation of the slot, which
// on a slot of a million payouts takes seconds, and the status needs only "any?" per state.
// Index use: the slot's primary key backwards, stepwise_run_slot_idx, and
// stepwise_operation_run_key_idx (run_key, state) per state.
func (h *handler) latestSlots(ctx context.Context, name string, n int) ([]*schedule.SlotReport, error) {
	rows, err := h.db.Query(ctx, `SELECT slot, status, coalesce(reason, ''), coalesce(detail, ''), shards,
			created_at, materialized_at, started_at, runs_done_at
		FROM stepwise_schedule_slot WHERE schedule = $1 ORDER BY slot DESC LIMIT $2`, name, n)
	if err != nil {
		return nil, err
	}
	reports, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*schedule.SlotReport, error) {
		r := &schedule.SlotReport{Schedule: name, Runs: map[string]int{}, Operations: map[outbox.State]int{}}
		err := row.Scan(&r.Slot, &r.Decision, &r.Reason, &r.Detail, &r.Shards, &r.DecidedAt, &r.MaterializedAt, &r.StartedAt, &r.RunsDoneAt)
		r.Slot = r.Slot.UTC()
		return r, err
	})
	if err != nil {
		return nil, err
	}
	var states []string
	for _, s := range outbox.States() {
		states = append(states, string(s))
	}
	for _, r := range reports {
		rows, err := h.db.Query(ctx, `SELECT key, status FROM stepwise_run WHERE schedule = $1 AND slot = $2`, name, r.Slot)
		if err != nil {
			return nil, err
		}
		var keys []string
		var key, status string
		if _, err := pgx.ForEachRow(rows, []any{&key, &status}, func() error {
			keys = append(keys, key)
			r.Runs[status]++
			return nil
		}); err != nil {
			return nil, err
		}
		if r.Decision == schedule.SlotMaterialized && len(keys) < r.Shards {
			r.Runs[schedule.RunMissing] = r.Shards - len(keys)
		}
		if len(keys) > 0 {
			rows, err = h.db.Query(ctx, `SELECT s.state,
					(SELECT count(*) FROM (SELECT 1 FROM stepwise_operation o WHERE o.run_key = ANY($1) AND o.state = s.state LIMIT $3) x)::int
				FROM unnest($2::text[]) s(state)`, keys, states, countCap+1)
			if err != nil {
				return nil, err
			}
			var state string
			var c int
			if _, err := pgx.ForEachRow(rows, []any{&state, &c}, func() error {
				if c > 0 {
					r.Operations[outbox.State(state)] = c
				}
				return nil
			}); err != nil {
				return nil, err
			}
		}
		r.NeedsAttention = r.Operations[outbox.StateManual]
		r.Status = schedule.DeriveBatchStatus(r.Decision, r.Shards, r.Runs, r.Operations)
	}
	return reports, nil
}
