package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// Bad input to every subcommand: a clear error naming the fix, the documented exit code,
// and nothing changed in the database.
func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBURL(t)
	// One database with a failed run, a MANUAL operation and a schedule.
	p, err := pgxNew(ctx, db)
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Exec(ctx, `
		INSERT INTO stepwise_checkpoint (key) VALUES ('r/failed'), ('r/ok');
		INSERT INTO stepwise_run (key, workflow, input, status, finished_at) VALUES ('r/failed', 'settle', '{}', 'failed', now()), ('r/ok', 'settle', '{}', 'succeeded', now());
		INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state, manual_reason)
			VALUES ('6b1f0c9e-3d0a-5f43-9b52-7f8e0a7d2c11', 'payout', 'bk-1', '{}', '\x00', 'r/ok', 'MANUAL', 'mismatch');
		INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
			VALUES ('nightly', '0 1 * * *', 'UTC', 'run_after', '{}', 'allow_all', 1, now());`)
	require.NoError(t, err)
	const op = "6b1f0c9e-3d0a-5f43-9b52-7f8e0a7d2c11"
	before := snapshot(t, p)

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"runs", "frobnicate"}, 2, `unknown command "frobnicate"; want one of list, show, cancel, resume`},
		{[]string{"runs", "--status", "stuck"}, 2, `--status "stuck": want one of pending, running, succeeded, failed, cancelled`},
		{[]string{"runs", "--limit", "0"}, 2, "--limit 0: want 1 to 1000"},
		{[]string{"runs", "--no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{"runs", "show"}, 2, "KEY (the run's key"},
		{[]string{"runs", "show", "a", "b"}, 2, `unexpected argument "b"`},
		{[]string{"runs", "show", "no/such/run"}, 3, `no run with key "no/such/run"`},
		{[]string{"runs", "cancel", "r/failed", "--actor", "ana"}, 2, "--reason is required"},
		{[]string{"runs", "cancel", "r/failed", "--reason", "x", "--actor", "ana"}, 1, `run "r/failed" is failed: only a pending or running run can be cancelled; nothing was changed`},
		{[]string{"runs", "cancel", "no/such/run", "--reason", "x", "--actor", "ana"}, 3, `no run with key "no/such/run"`},
		{[]string{"runs", "resume", "r/failed", "--reason", "fixed\nactor: root", "--actor", "ana"}, 2, "--reason"},
		{[]string{"runs", "resume", "r/failed", "--reason", "refund \u202e001", "--actor", "ana"}, 2, "U+202E"},
		{[]string{"runs", "resume", "r/failed", "--reason", "x", "--actor", "ana", "--seen-version", "-1"}, 2, "--seen-version -1"},
		{[]string{"runs", "resume", "r/failed", "--reason", "x", "--actor", "ana", "--seen-version", "7"}, 1, "has never had version 7"},
		{[]string{"runs", "resume", "r/ok", "--reason", "x", "--actor", "ana"}, 1, "not resumable"},
		// A resume names the version seen: without it, the refusal says what the run is now.
		{[]string{"runs", "resume", "r/failed", "--reason", "x", "--actor", "ana"}, 2, "--seen-version is required: run r/failed is failed now (version "},
		{[]string{"runs", "resume", "no/such/run", "--reason", "x", "--actor", "ana"}, 3, "not found"},
		{[]string{"ops", "--state", "LOST"}, 2, `--state "LOST": want one of`},
		{[]string{"ops", "show", "42"}, 2, `ID "42": want an operation id (a UUID`},
		{[]string{"ops", "show", "00000000-0000-0000-0000-000000000001"}, 3, "no operation 00000000-0000-0000-0000-000000000001"},
		{[]string{"ops", "resolve", op, "--reason", "x", "--actor", "ana", "--no-callback"}, 2, "--to is required"},
		{[]string{"ops", "resolve", op, "--to", "PAID", "--reason", "x", "--actor", "ana", "--no-callback"}, 2, `--to "PAID": want SUCCEEDED, FAILED_PERMANENT or RETRYABLE`},
		{[]string{"ops", "resolve", op, "--to", "SUCCEEDED", "--from", "PENDING", "--reason", "x", "--actor", "ana", "--no-callback"}, 2, "--from \"PENDING\""},
		{[]string{"ops", "resolve", op, "--to", "SUCCEEDED", "--reason", "x", "--actor", "ana"}, 2, "pass --no-callback"},
		{[]string{"ops", "resolve", op, "--to", "SUCCEEDED", "--reason", "x", "--actor", "ana", "--no-callback", "--from", "UNKNOWN_EXTERNAL", "--seen-version", "1"}, 1, "not UNKNOWN_EXTERNAL at version 1 as you saw: nothing was changed"},
		// A decision names the version seen: without it, the refusal says what the operation is now.
		{[]string{"ops", "resolve", op, "--to", "SUCCEEDED", "--reason", "x", "--actor", "ana", "--no-callback"}, 2, "--seen-version is required: operation " + op},
		{[]string{"ops", "resolve", op, "--to", "SUCCEEDED", "--reason", "x", "--actor", "ana", "--no-callback", "--seen-version", "9"}, 1, "is MANUAL at version 1 now, not version 9 as you saw"},
		{[]string{"ops", "resolve", op, "--to", "SUCCEEDED", "--reason", "x", "--actor", "a\u200bna", "--no-callback"}, 2, "U+200B"},
		{[]string{"schedules", "pause", "nightly"}, 2, "--reason is required"},
		{[]string{"schedules", "pause", "daily", "--reason", "x", "--actor", "ana"}, 3, `no schedule "daily"`},
		{[]string{"schedules", "slots", "daily"}, 3, `no schedule "daily"`},
		{[]string{"schedules", "slots", "nightly", "--limit", "5000"}, 2, "--limit 5000: want 1 to 1000"},
		{[]string{"prune"}, 2, "--older-than is required"},
		{[]string{"prune", "--older-than", "1h"}, 2, "--older-than 1h0m0s: want 24h0m0s"},
		{[]string{"prune", "--older-than", "48h", "--failed-run", "r/ok", "--apply"}, 1, `--failed-run: run "r/ok" is succeeded`},
		{[]string{"prune", "--older-than", "48h", "--failed-run", "nope"}, 1, `--failed-run: there is no run "nope"`},
		{[]string{"migrate", "sideways"}, 2, `unknown command "sideways"`},
		{[]string{"console", "--addr", "0.0.0.0:0"}, 2, "is beyond loopback: set the console's operators"},
		{[]string{"console", "--addr", "nonsense"}, 2, `--addr "nonsense": want host:port`},
	} {
		r := stepwise(t, db, tc.args...)
		require.Equal(t, tc.code, r.code, "%q: stderr %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%q", tc.args)
		require.Empty(t, r.stdout, "%q: a refusal prints nothing on stdout", tc.args)
		require.Equal(t, before, snapshot(t, p), "%q changed the database", tc.args)
	}

	// No database at all: the fix is named, exit 2.
	r := stepwise(t, "", "runs")
	if strings.Contains(r.stderr, "no database") { // unless DATABASE_URL is set in this environment
		require.Equal(t, 2, r.code)
		require.Contains(t, r.stderr, "set DATABASE_URL or pass --database-url")
	}
}
