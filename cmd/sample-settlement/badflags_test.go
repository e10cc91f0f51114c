package main

import (
	"strings"
	"testing"
)

// Every command's bad flags are refused before anything runs, with exit
// code 2 and a message naming the flag; none panics (a panic here would end the test binary).
// No database is reachable at the URL given, so a flag that is not refused shows up as a
// connection error (exit 1) instead of the usage error.
func TestBadFlagsOfEveryCommand(t *testing.T) {
	t.Parallel()
	noDB := []string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}
	long := strings.Repeat("x", 100_000)
	tests := []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"seed", "--transactions", "9223372036854775807"}, "--transactions"},
		{[]string{"seed", "--transactions", "-1"}, "--transactions"},
		{[]string{"seed", "--merchants", "0"}, "--merchants"},
		{[]string{"seed", "--merchants", "9223372036854775807"}, "--merchants"},
		{[]string{"seed", "--closed-accounts", "NaN"}, "--closed-accounts"},
		{[]string{"seed", "--closed-accounts", "+Inf"}, "--closed-accounts"},
		{[]string{"seed", "--closed-accounts", "1.5"}, "--closed-accounts"},
		{[]string{"seed", "--date", "2026-02-30"}, "--date"},
		{[]string{"settle", "--date", testDateText, "--shards", "0"}, "--shards"},
		{[]string{"settle", "--date", testDateText, "--shards", "-3"}, "--shards"},
		{[]string{"settle", "--date", testDateText, "--shards", "100000"}, "--shards"},
		{[]string{"settle", "--date", testDateText, "--timeout", "-1s"}, "--timeout"},
		{[]string{"settle", "--date", testDateText, "--zone", "Mars/Olympus"}, "--zone"},
		{[]string{"settle", "--date", testDateText, "--bank-url", "ftp://bank"}, "--bank-url"},
		{[]string{"serve", "--batch-size", "100000000"}, "--batch-size"},
		{[]string{"serve", "--batch-size", "0"}, "--batch-size"},
		{[]string{"serve", "--shutdown-timeout", "-1s"}, "--shutdown-timeout"},
		{[]string{"serve", "--shards", "0"}, "--shards"},
		{[]string{"serve", "--settle-workers", "-1"}, "--settle-workers"},
		{[]string{"serve", "--payout-concurrency", "0"}, "--payout-concurrency"},
		{[]string{"serve", "--payout-timeout", "-5s"}, "--payout-timeout"},
		{[]string{"serve", "--lease", "-1s"}, "--lease"},
		{[]string{"serve", "--lease", "1ms"}, "--lease"},
		{[]string{"serve", "--reconcile-interval", "0s"}, "--reconcile-interval"},
		{[]string{"serve", "--reconcile-grace", "1s", "--payout-timeout", "5s"}, "--reconcile-grace"},
		{[]string{"serve", "--metrics-interval", "1ns"}, "--metrics-interval"},
		{[]string{"serve", "--db-max-conns", "-1"}, "--db-max-conns"},
		{[]string{"serve", "--addr", "nonsense"}, "--addr"},
		{[]string{"serve", "--batch-size", "ten"}, "batch-size"},
		{[]string{"resolve", "00000000-0000-0000-0000-000000000001", "--to", "SUCCEEDED", "--reason", long, "--actor", "ops"}, "--reason"},
		{[]string{"resolve", "00000000-0000-0000-0000-000000000001", "--to", "SUCCEEDED", "--reason", "ok", "--actor", "ops\nFORGED line"}, "--actor"},
		{[]string{"resolve", "00000000-0000-0000-0000-000000000001", "--to", "SUCCEEDED", "--reason", "a\x1b[2Jb", "--actor", "ops"}, "--reason"},
		{[]string{"resolve", "00000000-0000-0000-0000-000000000001", "--to", "SUCCEEDED", "--reason", "ok", "--actor", long}, "--actor"},
		{[]string{"resolve", "not-a-uuid", "--to", "SUCCEEDED", "--reason", "ok", "--actor", "ops"}, "OP_ID"},
		{[]string{"resolve", "00000000-0000-0000-0000-000000000001", "--to", "MAYBE", "--reason", "ok", "--actor", "ops"}, "--to"},
		{[]string{"report", "--date", "yesterday"}, "--date"},
		{[]string{"report"}, "--date"},
		{[]string{"invariants", "--date", "2026-13-01"}, "--date"},
		{[]string{"migrate", "extra"}, "unexpected argument"},
		{[]string{"demo", "--workers", "0"}, "--workers"},
		{[]string{"demo", "--batch-size", "100000000"}, "--batch-size"},
		{[]string{"demo", "--payout-concurrency", "-1"}, "--payout-concurrency"},
		{[]string{"demo", "--timeout", "-1s"}, "--timeout"},
		{[]string{"demo", "--transactions", "9223372036854775807"}, "--transactions"},
		{[]string{"demo", "--closed-accounts", "NaN"}, "--closed-accounts"},
		{[]string{"demo", "--shards", "0"}, "--shards"},
		{[]string{"statement-arrived"}, "--date"},
		{[]string{"statement-arrived", "--date", "2026-02-30"}, "--date"},
		{[]string{"statement-arrived", "--date", testDateText, "--id", "a\x1b[2Jb"}, "--id"},
		{[]string{"statement-arrived", "--date", testDateText, "--id", long}, "--id"},
		{[]string{"statement-arrived", "--date", testDateText, "extra"}, "unexpected argument"},
		{[]string{"prune"}, "--older-than"},
		{[]string{"prune", "--older-than", "1h"}, "--older-than"},
		{[]string{"prune", "--older-than", "-720h"}, "--older-than"},
		{[]string{"prune", "--older-than", "720h", "--batch-size", "0"}, "--batch-size"},
	}
	for _, tt := range tests {
		args := append(append([]string{}, tt.args...), noDB...)
		r := runCLI(t, args...)
		name := strings.Join(tt.args, " ")
		if len(name) > 120 {
			name = name[:120] + "..."
		}
		if r.code != 2 {
			t.Errorf("%s: exit %d, want 2 (usage); stderr:\n%s", name, r.code, truncateForLog(r.stderr))
			continue
		}
		if !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%s: the message does not name %q:\n%s", name, tt.want, truncateForLog(r.stderr))
		}
	}
}

// prune runs retention.Prune once and says what it deleted; a fresh date has nothing old.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "prune", "--older-than", "720h", "--database-url", seededDBURL(t))
	if r.code != 0 || !strings.Contains(r.stdout, "pruned in") || !strings.Contains(r.stdout, ": the history of 0 runs") {
		t.Fatalf("prune: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
