package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Get returns the operation with id, or an error matching ErrNotFound.
func Get(ctx context.Context, q stepwisetype.DBTX, id uuid.UUID) (*Operation, error) {
	op, err := ScanOperation(q.QueryRow(ctx, `SELECT `+columns+` FROM stepwise_operation WHERE operation_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading operation %s: %w", id, err)
	}
	return op, nil
}

// ListParams selects operations for List.
type ListParams struct {
	// State selects operations in this state. Required unless RunKey or BusinessKey is set
	// (then empty means any state).
	State State
	// Kind, when set, selects operations of this kind only.
	Kind string
	// RunKey, when set, selects the operations this run enqueued (Operation.RunKey).
	RunKey string
	// BusinessKey, when set, selects the operations with this business key (exact).
	BusinessKey string
	// Limit caps the result. Defaults to 100.
	Limit int
	// NewestFirst lists by creation, newest first, as a person browsing the ledger reads
	// it, and lets State be empty (any state). Default: oldest update first.
	NewestFirst bool
}

// List returns operations, oldest update first (for UNKNOWN_EXTERNAL and MANUAL, the ones
// waiting longest), or newest first (ListParams.NewestFirst).
func List(ctx context.Context, q stepwisetype.DBTX, params *ListParams) ([]*Operation, error) {
	if params == nil || (params.State != "" || params.RunKey == "" && params.BusinessKey == "" && !params.NewestFirst) && !params.State.valid() {
		return nil, errors.New("outbox.List: ListParams.State is required (use one of outbox.States()) unless RunKey or BusinessKey narrows the list")
	}
	limit := params.Limit
	if limit <= 0 {
		limit = 100
	}
	what := string(params.State)
	if what == "" {
		what = "matching"
	}
	sql := `SELECT ` + columns + ` FROM stepwise_operation
		WHERE ($1 = '' OR state = $1) AND ($2 = '' OR kind = $2) AND ($4 = '' OR run_key = $4) AND ($5 = '' OR business_key = $5)
		ORDER BY updated_at, operation_id LIMIT $3`
	args := []any{params.State, params.Kind, limit, params.RunKey, params.BusinessKey}
	if params.NewestFirst {
		// One range per state, merged: the newest of a kind (or a run) are read a page at a
		// time from the (kind | run_key, state, created_at, operation_id) indexes; there is no
		// index on (kind, created_at) (migration 016: every index is written on each state
		// change, on the delivery path).
		states := []string{string(params.State)}
		if params.State == "" {
			states = nil
			for _, st := range States() {
				states = append(states, string(st))
			}
		}
		sql = `SELECT ` + Columns("o") + ` FROM unnest($1::text[]) AS s(state) CROSS JOIN LATERAL (
			SELECT * FROM stepwise_operation
			WHERE state = s.state AND ($2 = '' OR kind = $2) AND ($4 = '' OR run_key = $4) AND ($5 = '' OR business_key = $5)
			ORDER BY created_at DESC, operation_id LIMIT $3) AS o
		ORDER BY o.created_at DESC, o.operation_id LIMIT $3`
		args[0] = states
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("listing %s operations: %w", what, err)
	}
	ops, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Operation, error) { return ScanOperation(r) })
	if err != nil {
		return nil, fmt.Errorf("listing %s operations: %w", what, err)
	}
	return ops, nil
}

// kindStateCount is the number of operations of a kind in a state.
type kindStateCount struct {
	Kind  string
	State State
	Count int64
}

// counts returns the number of operations per kind and state (states with none are left
// out). It reads the whole ledger: the tests' helper, never the metrics' (see countsActive).
func counts(ctx context.Context, q stepwisetype.DBTX) ([]kindStateCount, error) {
	rows, err := q.Query(ctx, `SELECT kind, state, count(*) FROM stepwise_operation GROUP BY kind, state ORDER BY kind, state`)
	if err != nil {
		return nil, fmt.Errorf("counting operations: %w", err)
	}
	return collectCounts(rows)
}

// countsActive is counts for the states that are not terminal (PENDING, PROCESSING,
// RETRYABLE, UNKNOWN_EXTERNAL, MANUAL), for the metrics. Each is read through its partial
// index, so its cost does not grow with the history of finished operations.
func countsActive(ctx context.Context, q stepwisetype.DBTX) ([]kindStateCount, error) {
	rows, err := q.Query(ctx, `
		SELECT kind, state, count(*) FROM stepwise_operation WHERE state IN ('PENDING', 'RETRYABLE') GROUP BY kind, state
		UNION ALL
		SELECT kind, state, count(*) FROM stepwise_operation WHERE state = 'PROCESSING' GROUP BY kind, state
		UNION ALL
		SELECT kind, state, count(*) FROM stepwise_operation WHERE state = 'UNKNOWN_EXTERNAL' GROUP BY kind, state
		UNION ALL
		SELECT kind, state, count(*) FROM stepwise_operation WHERE state = 'MANUAL' GROUP BY kind, state
		ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("counting active operations: %w", err)
	}
	return collectCounts(rows)
}

func collectCounts(rows pgx.Rows) ([]kindStateCount, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kindStateCount, error) {
		var c kindStateCount
		return c, r.Scan(&c.Kind, &c.State, &c.Count)
	})
	if err != nil {
		return nil, fmt.Errorf("counting operations: %w", err)
	}
	return out, nil
}

// oldestUnknown returns, per kind, how long the longest-waiting UNKNOWN_EXTERNAL operation has
// been unknown, for the metrics. Kinds with none are left out.
func oldestUnknown(ctx context.Context, q stepwisetype.DBTX) (map[string]time.Duration, error) {
	rows, err := q.Query(ctx, `
		SELECT kind, extract(epoch FROM now() - min(unknown_since))::float8
		FROM stepwise_operation WHERE state = 'UNKNOWN_EXTERNAL' GROUP BY kind`)
	if err != nil {
		return nil, fmt.Errorf("reading the oldest unknown operations: %w", err)
	}
	out := map[string]time.Duration{}
	for rows.Next() {
		var kind string
		var secs float64
		if err := rows.Scan(&kind, &secs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the oldest unknown operations: %w", err)
		}
		out[kind] = time.Duration(secs * float64(time.Second))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the oldest unknown operations: %w", err)
	}
	return out, nil
}

// UnfinishedForRuns counts the operations enqueued by the given runs (Operation.RunKey) that
// are not terminal: a batch is complete only when this is zero and its runs succeeded.
// MANUAL counts as unfinished: a person has yet to decide.
func UnfinishedForRuns(ctx context.Context, q stepwisetype.DBTX, runKeys ...string) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation
		WHERE run_key = ANY($1) AND state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT')`, runKeys).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting unfinished operations of %d runs: %w", len(runKeys), err)
	}
	return n, nil
}

// Request is one request of an operation: a Send call begun under a claim, or a claim lost
// with a dispatcher that died holding it (StartedAt nil: a request may or may not have begun).
type Request struct {
	Claim     int
	Actor     string
	StartedAt *time.Time
	EndedAt   *time.Time
	// Outcome is the state the request's result moved the operation to.
	Outcome State
	Error   string
}

// Requests returns the requests recorded for the operation id, oldest claim first. With
// Operation.Claims it tells an operation sent twice (two requests with StartedAt) from one
// merely claimed twice (one request, two claims).
func Requests(ctx context.Context, q stepwisetype.DBTX, id uuid.UUID) ([]Request, error) {
	rows, err := q.Query(ctx, `SELECT claim, actor, started_at, ended_at, outcome, coalesce(error, '')
		FROM stepwise_operation_request WHERE operation_id = $1 ORDER BY claim`, id)
	if err != nil {
		return nil, fmt.Errorf("reading the requests of operation %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Request, error) {
		var rq Request
		err := r.Scan(&rq.Claim, &rq.Actor, &rq.StartedAt, &rq.EndedAt, &rq.Outcome, &rq.Error)
		return rq, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the requests of operation %s: %w", id, err)
	}
	return out, nil
}
