package main

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The commands the README shows to paste, run in the form it gives (docs/commands_test.go
// checks that each one is run somewhere). Long ones run bounded on every CI run and at full
// size with STEPWISE_FULL=1.

// full reports whether the README's long commands run at the size the README gives.
func full() bool { return os.Getenv("STEPWISE_FULL") != "" }

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
	// README: sample-settlement resume settle/<slot>/<shard> --reason "bank back (INC-42)"
	r = runCLI(t, "resume", key, "--reason", "bank back (INC-42)", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	var actor, reason string
	require.NoError(t, pool.QueryRow(ctx, `SELECT actor, detail->>'reason' FROM stepwise_event
		WHERE subject = $1 AND kind = 'run.resume'`, key).Scan(&actor, &reason))
	require.Equal(t, "ops-on-call", actor)
	require.Equal(t, "bank back (INC-42)", reason)
}

func TestReadmeChaosCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("a chaos soak")
	}
	t.Parallel()
	duration := "5s"
	if full() {
		duration = "10m"
	}
	// README: go run ./cmd/sample-settlement chaos --profile mix --duration 10m
	out, err := runBuilt(t, nil, "chaos", "--profile", "mix", "--duration", duration)
	require.NoError(t, err, out)
	require.Contains(t, out, "all invariants hold")
}

func TestReadmeBenchCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("a benchmark")
	}
	t.Parallel()
	args := []string{"bench", "--quick"}
	if full() {
		args = []string{"bench"}
	}
	// README: go run ./cmd/sample-settlement bench
	out, err := runBuilt(t, nil, args...)
	require.NoError(t, err, out)
	require.Contains(t, out, "stepwise/floor B=100:")
}
