package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The commands the README shows to paste, run in the form it gives (docs/commands_test.go
// checks that each one is run somewhere). The lab's (chaos, bench) are cmd/stepwise-lab's.

func TestReadmeResumeCommand(t *testing.T) { // not parallel: it sets $USER
	dbURL := seededDBURL(t)
	ctx := context.Background()
	r := runCLI(t, "settle", "--date", testDateText, "--work=false", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var key string
	require.NoError(t, pool.QueryRow(ctx, `SELECT key FROM stepwise_run ORDER BY key LIMIT 1`).Scan(&key))
	// The run ends cancelled as maintenance ends a cancelled run nobody works (what is under
	// test is the resume command, not how the run stopped).
	_, err = pool.Exec(ctx, `UPDATE stepwise_run SET status = 'cancelled', finished_at = now(), updated_at = now(),
		last_error = 'cancelled by a test' WHERE key = $1`, key)
	require.NoError(t, err)

	t.Setenv("USER", "ops-on-call") // the actor defaults to $USER
	// README: without --seen-version the command refuses and says the version the run has now.
	var version int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM stepwise_run WHERE key = $1`, key).Scan(&version))
	r = runCLI(t, "resume", key, "--reason", "bank back (INC-42)", "--database-url", dbURL)
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, fmt.Sprintf("run %s is cancelled now (version %d, last error \"cancelled by a test\")", key, version))
	require.Contains(t, r.stderr, fmt.Sprintf("--seen-version %d", version))
	var resumes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind = 'run.resume'`, key).Scan(&resumes))
	require.Zero(t, resumes, "refused: nothing resumed")
	// README: sample-settlement resume settle/<slot>/<shard> --seen-version N --reason "bank back (INC-42)"
	r = runCLI(t, "resume", key, "--seen-version", itoa(version), "--reason", "bank back (INC-42)", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	var actor, reason string
	require.NoError(t, pool.QueryRow(ctx, `SELECT actor, detail->>'reason' FROM stepwise_event
		WHERE subject = $1 AND kind = 'run.resume'`, key).Scan(&actor, &reason))
	require.Equal(t, "ops-on-call", actor)
	require.Equal(t, "bank back (INC-42)", reason)
}
