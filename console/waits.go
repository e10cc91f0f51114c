package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/workflow"
)

// Waits and families (docs/design.md, "Waits"): a run page says what the run waits for, since
// when, until when and what is still missing (Run.Wait, the text the
// command prints too), and shows its parent and children; the overview and the runs list
// count and select the waiting runs.

// maxChildren bounds the children a run page lists; their counts by status cover the rest.
const maxChildren = 50

// maxWaitedKeys bounds the child keys a WaitForChildren's line names.
const maxWaitedKeys = 10

// waitFilters are the runs list's wait= values: a kind of wait, or "manual" for the runs
// whose wait for operations is held up by a MANUAL operation (a person must resolve it).
var waitFilters = []string{string(workflow.WaitOperations), string(workflow.WaitChildren), string(workflow.WaitSignal), waitManual}

const waitManual = "manual"

// waitingSQL is the condition that the run r waits now, joined as w (stepwise_wait holds a
// run's open wait; its row may outlive a run cancelled meanwhile, which no longer waits).
const waitingSQL = `r.status IN ('pending', 'running')`

// manualBlockSQL: the wait w for operations is held up by a MANUAL operation of its run
// (stepwise_operation_console_run_idx (run_key, state, ...): one probe).
const manualBlockSQL = `w.kind = 'operations' AND NOT w.manual_at_rest AND w.woken_at IS NULL
	AND EXISTS (SELECT 1 FROM stepwise_operation o WHERE o.run_key = w.run_key AND o.state = 'MANUAL')`

// waitView is a run's wait as its page shows it.
type waitView struct {
	*workflow.WaitState
	For      string       // how long it has waited
	Timeout  string       // when it times out, from now
	Waited   []string     // the children waited for (at most maxWaitedKeys)
	More     int          // children waited for beyond Waited
	Manual   template.URL // the run's MANUAL operations, when they hold the wait up
	Pending  template.URL // the run's operations
	Overdue  bool         // past the deadline, not woken: its timeout is due
	Resolves bool         // a person resolving the MANUAL operations lets it go on
}

func newWaitView(key string, w *workflow.WaitState, now time.Time) *waitView {
	if w == nil {
		return nil
	}
	v := &waitView{WaitState: w, For: now.Sub(w.Since).Round(time.Second).String()}
	switch d := w.Deadline.Sub(now); {
	case w.WokenAt != nil:
		v.Timeout = "woken " + w.WokenAt.UTC().Format("2006-01-02 15:04:05Z")
	case d > 0:
		v.Timeout = "in " + d.Round(time.Second).String()
	default:
		v.Overdue = true
		v.Timeout = "deadline passed " + (-d).Round(time.Second).String() + " ago: the run goes on timed out when a worker takes it"
	}
	if n := len(w.Children); n > maxWaitedKeys {
		v.Waited, v.More = w.Children[:maxWaitedKeys], n-maxWaitedKeys
	} else {
		v.Waited = w.Children
	}
	if w.Kind == workflow.WaitOperations {
		v.Pending = template.URL(url.Values{"run": {key}}.Encode())
		if w.Manual > 0 {
			v.Manual = template.URL(url.Values{"run": {key}, "state": {"MANUAL"}}.Encode())
			v.Resolves = !w.ManualAtRest && w.WokenAt == nil
		}
	}
	return v
}

// familyRun is a parent or child run as a run page lists it.
type familyRun struct {
	Key, Workflow string
	Status        workflow.RunStatus
	CreatedAt     time.Time
	FinishedAt    *time.Time
	LastError     *string
}

// family is a run's parent and children.
type family struct {
	// Parent is the run that started this one (nil: none); ParentGone when its row is gone.
	Parent     *familyRun
	ParentKey  string
	ParentGone bool
	// Children: at most maxChildren, unfinished and failed first; Counts by status (each
	// capped at countCap+1) and Total their sum.
	Children []familyRun
	Counts   []statusCount
	Total    int
}

type statusCount struct {
	Status string
	N      int
}

// childOrder is the order the children are listed in: those a person may need to look at
// first.
var childOrder = []string{string(workflow.RunStatusRunning), string(workflow.RunStatusPending), string(workflow.RunStatusFailed),
	string(workflow.RunStatusCancelled), string(workflow.RunStatusSucceeded)}

// family reads the parent and the children of run key. Bounded however large the family: the
// counts read at most countCap+1 entries of stepwise_run_parent_idx (parent_key, status) per
// status, and the list at most maxChildren per status from the same index (which of a
// status's children are listed, when it has more, is the index's order).
func (h *handler) family(ctx context.Context, key string, parent *string) (*family, error) {
	f := &family{}
	if parent != nil {
		f.ParentKey = *parent
		p := familyRun{}
		err := h.db.QueryRow(ctx, `SELECT key, workflow, status, created_at, finished_at, last_error FROM stepwise_run WHERE key = $1`, *parent).
			Scan(&p.Key, &p.Workflow, &p.Status, &p.CreatedAt, &p.FinishedAt, &p.LastError)
		switch {
		case err == nil:
			f.Parent = &p
		case errors.Is(err, pgx.ErrNoRows):
			f.ParentGone = true
		default:
			return nil, fmt.Errorf("reading the parent run: %w", err)
		}
	}
	rows, err := h.db.Query(ctx, `SELECT s.status,
			(SELECT count(*) FROM (SELECT 1 FROM stepwise_run r WHERE r.parent_key = $1 AND r.status = s.status LIMIT $3) x)::int
		FROM unnest($2::text[]) WITH ORDINALITY s(status, i) ORDER BY s.i`, key, childOrder, countCap+1)
	if err != nil {
		return nil, fmt.Errorf("counting the child runs: %w", err)
	}
	var sc statusCount
	if _, err := pgx.ForEachRow(rows, []any{&sc.Status, &sc.N}, func() error {
		if sc.N > 0 {
			f.Counts = append(f.Counts, sc)
			f.Total += sc.N
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("counting the child runs: %w", err)
	}
	if f.Total == 0 {
		return f, nil
	}
	rows, err = h.db.Query(ctx, `SELECT c.key, c.workflow, c.status, c.created_at, c.finished_at, c.last_error
		FROM unnest($2::text[]) WITH ORDINALITY s(status, i)
		CROSS JOIN LATERAL (SELECT * FROM stepwise_run r WHERE r.parent_key = $1 AND r.status = s.status LIMIT $3) c
		ORDER BY s.i, c.created_at, c.key LIMIT $3`, key, childOrder, maxChildren)
	if err != nil {
		return nil, fmt.Errorf("listing the child runs: %w", err)
	}
	f.Children, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (familyRun, error) {
		var c familyRun
		err := row.Scan(&c.Key, &c.Workflow, &c.Status, &c.CreatedAt, &c.FinishedAt, &c.LastError)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing the child runs: %w", err)
	}
	return f, nil
}

// waitingCount is the overview's line for one kind of wait.
type waitingCount struct {
	Kind    string
	Waiting int // runs waiting
	Woken   int // of them, woken: due, waiting for a worker
	Overdue int // past their deadline, not woken: their timeout is due
	Manual  int // held up by a MANUAL operation: a person must resolve it
}

// waitingCounts counts the waiting runs by kind of wait: one row per open wait (as the
// stepwise_runs_waiting metric), so the count costs what the waits are, never the history.
func (h *handler) waitingCounts(ctx context.Context) ([]waitingCount, error) {
	rows, err := h.db.Query(ctx, `SELECT k.kind, count(w.run_key)::int,
			count(w.run_key) FILTER (WHERE w.woken_at IS NOT NULL)::int,
			count(w.run_key) FILTER (WHERE w.woken_at IS NULL AND w.deadline <= now())::int,
			count(w.run_key) FILTER (WHERE w.blocked)::int
		FROM unnest($1::text[]) WITH ORDINALITY k(kind, i)
		LEFT JOIN (SELECT w.*, (`+manualBlockSQL+`) AS blocked FROM stepwise_wait w JOIN stepwise_run r ON r.key = w.run_key AND `+waitingSQL+`) w ON w.kind = k.kind
		GROUP BY k.kind, k.i ORDER BY k.i`, waitFilters[:3])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (waitingCount, error) {
		var c waitingCount
		err := row.Scan(&c.Kind, &c.Waiting, &c.Woken, &c.Overdue, &c.Manual)
		return c, err
	})
}
