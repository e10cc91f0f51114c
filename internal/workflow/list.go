package workflow

import (
	"context"
	"fmt"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// ListRunsParams selects runs for ListRuns. Every filter is optional.
type ListRunsParams struct {
	// Status selects runs in this status.
	Status RunStatus
	// Workflow selects runs of this workflow (the River job kind of their args).
	Workflow string
	// Schedule selects the runs this schedule started.
	Schedule string
	// KeyPrefix selects runs whose key starts with it, compared as text ("_" and "%" are
	// ordinary characters, not LIKE patterns).
	KeyPrefix string
	// Limit caps the result: 1 to 1000, 0 for 100.
	Limit int
}

// ListRuns lists runs, newest first, with their derived retry state as GetRun reads it.
func ListRuns(ctx context.Context, q stepwisetype.DBTX, params *ListRunsParams) ([]*Run, error) {
	p := ListRunsParams{}
	if params != nil {
		p = *params
	}
	switch {
	case p.Limit == 0:
		p.Limit = 100
	case p.Limit < 0 || p.Limit > 1000:
		return nil, fmt.Errorf("workflow.ListRuns: Limit %d: want 1 to 1000, or 0 for 100", p.Limit)
	}
	if p.Status != "" && !p.Status.valid() {
		return nil, fmt.Errorf("workflow.ListRuns: Status %q: want pending, running, succeeded, failed or cancelled", p.Status)
	}
	rows, err := q.Query(ctx, `SELECT `+runColumnsSQL+` FROM stepwise_run r`+runJoinsSQL+`
		WHERE ($1 = '' OR r.status = $1) AND ($2 = '' OR r.workflow = $2) AND ($3 = '' OR r.schedule = $3)
		  AND ($4 = '' OR left(r.key, length($4)) = $4)
		ORDER BY r.created_at DESC, r.key
		LIMIT $5`, string(p.Status), p.Workflow, p.Schedule, p.KeyPrefix, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("listing runs: %w", err)
	}
	defer rows.Close()
	var out []*Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("listing runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing runs: %w", err)
	}
	return out, nil
}

func (s RunStatus) valid() bool {
	return s == RunStatusPending || s == RunStatusRunning || s.Finished()
}
