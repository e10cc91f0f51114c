package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// What a team that built its service from the README's quick start does with the command,
// on its database, without writing Go: every subcommand, its table and its --json, and the
// changes it makes (audited) checked in the database.
func TestCommandsOnAQuickStartDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, pool, bank := quickStartDB(t)

	// migrate status and migrate: the quick start migrated; migrate again is a no-op.
	// README: stepwise migrate status
	r := stepwise(t, db, "migrate", "status").ok(t)
	require.Contains(t, r.stdout, "stepwise")
	require.Contains(t, r.stdout, "current")
	var st struct {
		Schema struct{ Current bool } `json:"schema"`
	}
	stepwise(t, db, "migrate", "status", "--json").ok(t).json(t, &st)
	require.True(t, st.Schema.Current)
	// README: stepwise migrate
	require.Contains(t, stepwise(t, db, "migrate").ok(t).stdout, "up to date")

	// runs: the quick start's run, its filters.
	r = stepwise(t, db, "runs").ok(t)
	require.Contains(t, r.stdout, "settle/2026-11-29")
	require.Contains(t, r.stdout, "succeeded")
	// README: stepwise runs --status failed
	require.Contains(t, stepwise(t, db, "runs", "--status", "failed").ok(t).stdout, "no runs match")
	var runs []runRow
	stepwise(t, db, "runs", "--json", "--workflow", "settle", "--key-prefix", "settle/2026-11").ok(t).json(t, &runs)
	require.Len(t, runs, 1)
	require.Equal(t, "succeeded", runs[0].Status)
	stepwise(t, db, "runs", "--json", "--key-prefix", "settle/2026-12").ok(t).json(t, &runs)
	require.Empty(t, runs)

	// README: stepwise runs show settle/2026-11-29
	r = stepwise(t, db, "runs", "show", "settle/2026-11-29").ok(t)
	for _, want := range []string{"status     succeeded (version", "cursor     {\"after_merchant\": 20}", "lease      none", "failures   0 in a row", "run.finish"} {
		require.Contains(t, r.stdout, want)
	}
	var shown runShow
	stepwise(t, db, "runs", "show", "--json", "settle/2026-11-29", "--events", "3").ok(t).json(t, &shown)
	require.Equal(t, "settle/2026-11-29", shown.RunJSON.Key)
	require.Len(t, shown.Events, 3, "the newest 3")
	require.Equal(t, "run.finish", shown.Events[0].Kind)

	// ops: twenty payouts, two UNKNOWN_EXTERNAL (the bank's answer lost).
	var ops []opRow
	stepwise(t, db, "ops", "--json", "--kind", "payout", "--limit", "100").ok(t).json(t, &ops)
	require.Len(t, ops, 20)
	stepwise(t, db, "ops", "list", "--state", "unknown_external", "--json", "--run", "settle/2026-11-29").ok(t).json(t, &ops)
	require.Len(t, ops, 2)
	unknown := ops[0]
	// README: stepwise ops --state UNKNOWN_EXTERNAL
	require.Contains(t, stepwise(t, db, "ops", "--state", "UNKNOWN_EXTERNAL").ok(t).stdout, unknown.ID.String())
	r = stepwise(t, db, "ops", "--business-key", unknown.BusinessKey).ok(t)
	require.Contains(t, r.stdout, unknown.ID.String())
	// README: stepwise ops show <OPERATION_ID>
	r = stepwise(t, db, "ops", "show", unknown.ID.String()).ok(t)
	for _, want := range []string{"state        UNKNOWN_EXTERNAL (version", "requests (one per send begun", "audit trail", "op.transition", "stepwise ops resolve " + unknown.ID.String()} {
		require.Contains(t, r.stdout, want)
	}

	// ops resolve: the bank says it paid (it applied the payment before the answer was
	// lost). Without --no-callback it refuses; with a stale --seen-version it refuses; then
	// it resolves, audited.
	require.Equal(t, 1, bank.Effects(unknown.ID.String()), "the bank applied the lost payment")
	before := snapshot(t, pool)
	r = stepwise(t, db, "ops", "resolve", unknown.ID.String(), "--to", "SUCCEEDED", "--reason", "bank support confirmed, ticket 4711", "--actor", "ana")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "pass --no-callback")
	r = stepwise(t, db, "ops", "resolve", unknown.ID.String(), "--to", "SUCCEEDED", "--no-callback", "--seen-version", "1", "--reason", "ticket 4711", "--actor", "ana")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "nothing was changed")
	require.Equal(t, before, snapshot(t, pool), "a refused resolve changes nothing")
	// README: stepwise ops resolve <OPERATION_ID> --to SUCCEEDED --seen-version 3 --no-callback --actor ana --reason "bank confirmed, ticket 4711"
	require.EqualValues(t, 3, unknown.Version, "PENDING, PROCESSING, UNKNOWN_EXTERNAL")
	r = stepwise(t, db, "ops", "resolve", unknown.ID.String(), "--to", "SUCCEEDED", "--seen-version", itoa(unknown.Version), "--no-callback", "--actor", "ana", "--reason", "bank confirmed, ticket 4711").ok(t)
	require.Contains(t, r.stdout, "is now SUCCEEDED")
	require.Equal(t, "SUCCEEDED", column(t, pool, `SELECT state FROM stepwise_operation WHERE operation_id = $1`, unknown.ID))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'op:' || $1::text AND actor = 'ana'
		AND to_state = 'SUCCEEDED' AND detail->>'resolution' = 'manual' AND detail->>'reason' = 'bank confirmed, ticket 4711'`, unknown.ID))
	r = stepwise(t, db, "ops", "resolve", unknown.ID.String(), "--to", "FAILED_PERMANENT", "--no-callback", "--reason", "again", "--actor", "bob")
	require.Equal(t, 1, r.code, "a settled operation is not resolved again")
	require.Contains(t, r.stderr, "is SUCCEEDED: only MANUAL and UNKNOWN_EXTERNAL")
	// The other lost answer, settled the same way: not left to the reconciler of the quick
	// start's next run, whose lookup would come whenever the machine got round to it (prune
	// below needs the run's every operation settled).
	other := ops[1]
	require.Equal(t, 1, bank.Effects(other.ID.String()), "the bank applied the other lost payment")
	stepwise(t, db, "ops", "resolve", other.ID.String(), "--to", "SUCCEEDED", "--seen-version", itoa(other.Version), "--no-callback", "--actor", "bob", "--reason", "bank confirmed, ticket 4712").ok(t)

	// runs cancel, then the service's worker ends the run cancelled; runs resume continues it.
	startRun(t, pool, "settle/2026-11-30", "2026-11-30")
	// README: stepwise runs cancel settle/2026-11-30 --actor ana --reason "wrong date, INC-12"
	r = stepwise(t, db, "runs", "cancel", "settle/2026-11-30", "--actor", "ana", "--reason", "wrong date, INC-12").ok(t)
	require.Contains(t, r.stdout, "asked to stop")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'settle/2026-11-30' AND kind = 'console.action'
		AND actor = 'ana' AND detail->>'action' = 'run.cancel' AND detail->>'via' = 'stepwise command'`))
	runQuickStart(t, pool, db, bank.URL(), func() bool {
		return column(t, pool, `SELECT status FROM stepwise_run WHERE key = 'settle/2026-11-30'`) == "cancelled"
	})
	r = stepwise(t, db, "runs", "show", "settle/2026-11-30").ok(t)
	require.Contains(t, r.stdout, "status     cancelled")
	require.Contains(t, r.stdout, "stepwise runs resume settle/2026-11-30 --seen-version")
	stepwise(t, db, "runs", "show", "--json", "settle/2026-11-30").ok(t).json(t, &shown)
	before = snapshot(t, pool)
	r = stepwise(t, db, "runs", "resume", "settle/2026-11-30", "--reason", "date fixed", "--actor", "ana", "--seen-version", "1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "nothing was done")
	require.Equal(t, before, snapshot(t, pool))
	// README: stepwise runs resume settle/2026-11-30 --seen-version 3 --actor ana --reason "date fixed, INC-12"
	require.EqualValues(t, 3, shown.RunJSON.Version, "pending, running, cancelled")
	// A child that failed after the run ended (news the version ana saw does not show) is left
	// as it is, and the command says so.
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) VALUES ('settle/2026-11-30/eur');
		INSERT INTO stepwise_run (key, workflow, input, status, parent_key, finished_at, last_error)
		VALUES ('settle/2026-11-30/eur', 'settle', '{}', 'failed', 'settle/2026-11-30', clock_timestamp(), 'acct-9 frozen')`)
	require.NoError(t, err)
	r = stepwise(t, db, "runs", "resume", "settle/2026-11-30", "--seen-version", itoa(shown.RunJSON.Version), "--actor", "ana", "--reason", "date fixed, INC-12").ok(t)
	require.Contains(t, r.stdout, "resumed from its last checkpoint")
	require.Contains(t, r.stdout, "left as they are (failed or cancelled after the run ended; a parent waiting for them goes on without them: resume each on its own if that is the decision): settle/2026-11-30/eur")
	require.Equal(t, "failed", column(t, pool, `SELECT status FROM stepwise_run WHERE key = 'settle/2026-11-30/eur'`))
	require.Equal(t, "pending", column(t, pool, `SELECT status FROM stepwise_run WHERE key = 'settle/2026-11-30'`))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'settle/2026-11-30' AND kind = 'run.resume' AND actor = 'ana'`))
	r = stepwise(t, db, "runs", "cancel", "settle/2026-11-29", "--reason", "x", "--actor", "ana")
	require.Equal(t, 1, r.code, "a finished run is not cancelled")
	require.Contains(t, r.stderr, "is succeeded: only a pending or running run")

	// schedules: a schedule row and two decided slots, as a tick leaves them.
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
		VALUES ('nightly', '0 1 * * *', 'UTC', 'run_after', '{}', 'buffer_all', 1, '2026-11-29T01:00:00Z')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_schedule_slot (schedule, slot, status, reason, detail, shards, version, materialized_at) VALUES
		('nightly', '2026-11-28T01:00:00Z', 'skipped', 'misfire_deadline', 'later than the starting deadline', 1, 1, NULL),
		('nightly', '2026-11-29T01:00:00Z', 'materialized', NULL, NULL, 1, 1, now())`)
	require.NoError(t, err)
	// README: stepwise schedules
	r = stepwise(t, db, "schedules").ok(t)
	require.Contains(t, r.stdout, "nightly")
	require.Contains(t, r.stdout, "active")
	r = stepwise(t, db, "schedules", "slots", "nightly").ok(t)
	require.Contains(t, r.stdout, "SKIPPED")
	require.Contains(t, r.stdout, "FAILED", "a materialized slot without its run is not evidence of anything done")
	var slots []slotJSON
	stepwise(t, db, "schedules", "slots", "nightly", "--json").ok(t).json(t, &slots)
	require.Len(t, slots, 2)
	require.Contains(t, stepwise(t, db, "schedules", "pause", "nightly", "--reason", "bank holiday", "--actor", "ana").ok(t).stdout, "paused by ana")
	require.Equal(t, "true", column(t, pool, `SELECT paused::text FROM stepwise_schedule WHERE name = 'nightly'`))
	require.Contains(t, stepwise(t, db, "schedules", "pause", "nightly", "--reason", "again", "--actor", "ana").ok(t).stdout, "already paused")
	require.Contains(t, stepwise(t, db, "schedules", "resume", "nightly", "--reason", "holiday over", "--actor", "ana").ok(t).stdout, "resumed by ana")
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'schedule:nightly' AND actor = 'ana'`))

	// prune: a dry run deletes nothing; it says what --apply then deletes. The history is
	// made old by moving its clock back ten days (the rows themselves are the quick start's).
	_, err = pool.Exec(ctx, `UPDATE stepwise_run SET finished_at = finished_at - interval '10 days' WHERE key = 'settle/2026-11-29';
		UPDATE stepwise_event SET at = at - interval '10 days'`)
	require.NoError(t, err)
	// README: stepwise prune --older-than 720h
	require.Contains(t, stepwise(t, db, "prune", "--older-than", "720h").ok(t).stdout, "would delete: the event history of 0 runs", "nothing is 30 days old")
	before = snapshot(t, pool)
	events := count(t, pool, `SELECT count(*) FROM stepwise_event`)
	r = stepwise(t, db, "prune", "--older-than", "168h").ok(t)
	require.Contains(t, r.stdout, "dry run (nothing deleted)")
	require.Contains(t, r.stdout, "would delete: the event history of 1 runs")
	require.Equal(t, before, snapshot(t, pool), "a dry run changes nothing")
	var dry, applied struct {
		DryRun          bool  `json:"dry_run"`
		Runs            int64 `json:"runs"`
		RunEvents       int64 `json:"run_events"`
		OperationEvents int64 `json:"operation_events"`
	}
	stepwise(t, db, "prune", "--older-than", "168h", "--json").ok(t).json(t, &dry)
	require.True(t, dry.DryRun)
	require.Positive(t, dry.RunEvents)
	require.Positive(t, dry.OperationEvents)
	defer pruneProgressEvery.Store(pruneProgressEvery.Swap(0)) // a line after every batch
	r = stepwise(t, db, "prune", "--older-than", "168h", "--apply", "--json").ok(t)
	r.json(t, &applied)
	require.Regexp(t, `(?m)^prune: \d+s so far: the history of \d+ runs, \d+ run events, \d+ operation events, \d+ signals \(\d+ batches, \d+ rows/s\)$`, r.stderr,
		"a long prune says on stderr that it is moving (stdout stays JSON)")
	require.False(t, applied.DryRun)
	require.Equal(t, [3]int64{dry.Runs, dry.RunEvents, dry.OperationEvents}, [3]int64{applied.Runs, applied.RunEvents, applied.OperationEvents}, "the dry run said what --apply deleted")
	require.Equal(t, int64(events)-applied.RunEvents-applied.OperationEvents, int64(count(t, pool, `SELECT count(*) FROM stepwise_event`)))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'op:' || $1::text AND actor = 'ana'`, unknown.ID), "ana's resolution is kept")
	require.Contains(t, stepwise(t, db, "runs", "show", "settle/2026-11-29").ok(t).stdout, "history    pruned")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
