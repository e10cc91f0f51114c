package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// runs resume --json says what it left as they are as a list, [] when it left none, never
// null: a script reading it iterates over the list, and null would read as "unknown" to
// some and as "none" to others.
func TestRunsResumeJSONListsWhatItLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBURL(t)
	p, err := pgxNew(ctx, db)
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Exec(ctx, `
		INSERT INTO stepwise_checkpoint (key) VALUES ('r/failed');
		INSERT INTO stepwise_run (key, workflow, input, status, finished_at) VALUES ('r/failed', 'settle', '{}', 'failed', now());`)
	require.NoError(t, err)

	r := stepwise(t, db, "runs", "resume", "r/failed", "--seen-version", "1", "--actor", "ana", "--reason", "INC-3 fixed", "--json").ok(t)
	var out map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.JSONEq(t, `[]`, string(out["left_as_they_are"]), r.stdout)
	require.JSONEq(t, `true`, string(out["resumed"]), r.stdout)
}
