package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestHelpOnEveryCommand(t *testing.T) {
	t.Parallel()
	mine := []string{"bank", "bench", "chaos", "chaos-worker"}
	for _, name := range mine {
		r := runCLI(t, name, "--help")
		require.Equal(t, 0, r.code, name)
		require.Contains(t, strings.ToLower(r.stderr), "usage: stepwise-lab "+name, name)
	}
	r := runCLI(t, "help")
	require.Equal(t, 0, r.code)
	for _, name := range mine {
		require.Contains(t, r.stdout, "  "+name+" ")
	}
	r = runCLI(t, "chaso")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `unknown command "chaso"`)
}

// Every command's bad flags are refused before anything runs, with exit code 2 and a message
// naming the flag; none panics (a panic here would end the test binary).
func TestBadFlagsOfEveryCommand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"bank", "--refuse", "NaN"}, "--refuse"},
		{[]string{"bank", "--drop-after", "-0.5"}, "--drop-after"},
		{[]string{"bank", "--addr", "nonsense"}, "--addr"},
		{[]string{"bench", "--rounds", "0"}, "--rounds"},
		{[]string{"bench", "--rounds", "-5"}, "--rounds"},
		{[]string{"bench", "--rounds", "9223372036854775807"}, "--rounds"},
		{[]string{"bench", "--rounds", "many"}, "rounds"},
		{[]string{"bench", "--merchants", "0"}, "--merchants"},
		{[]string{"bench", "--merchants", "-1"}, "--merchants"},
		{[]string{"bench", "--merchants", "9223372036854775807"}, "--merchants"},
		{[]string{"bench", "--batches", "0,abc"}, "--batches"},
		{[]string{"bench", "--batches", "0"}, "--batches"},
		{[]string{"bench", "--batches", "-100"}, "--batches"},
		{[]string{"bench", "--batches", ","}, "--batches"},
		{[]string{"bench", "--batches", "100000000"}, "--batches"},
		{[]string{"bench", "--batches", "9223372036854775807k"}, "--batches"},
		{[]string{"bench", "--sizes", "0"}, "--sizes"},
		{[]string{"bench", "--sizes", "1e9"}, "--sizes"},
		{[]string{"bench", "--sizes", "9223372036854775807M"}, "--sizes"},
		{[]string{"bench", "--sizes", "-10k"}, "--sizes"},
		{[]string{"bench", "--size-batch", "0"}, "--size-batch"},
		{[]string{"bench", "--takeover-procs", "0"}, "--takeover-procs"},
		{[]string{"bench", "--takeover-procs", "1"}, "--takeover-procs"},
		{[]string{"bench", "--takeover-procs", "100000"}, "--takeover-procs"},
		{[]string{"bench", "--takeover-maintenance", "nowhere"}, "--takeover-maintenance"},
		{[]string{"bench", "--kills", "0"}, "--kills"},
		{[]string{"bench", "--kills", "1000000"}, "--kills"},
		{[]string{"bench", "--lease", "-1s"}, "--lease"},
		{[]string{"bench", "--lease", "1ns"}, "--lease"},
		{[]string{"bench", "--lease", "1000h"}, "--lease"},
		{[]string{"bench", "--delivery-ops", "0"}, "--delivery-ops"},
		{[]string{"bench", "--reconcile-ops", "-1"}, "--reconcile-ops"},
		{[]string{"bench", "--river-items", "0"}, "--river-items"},
		{[]string{"bench", "--river-workers", "0"}, "--river-workers"},
		{[]string{"bench", "--max-items-b1", "0"}, "--max-items-b1"},
		{[]string{"bench", "--scale-procs", "0"}, "--scale-procs"},
		{[]string{"bench", "--scale-procs", "1,x"}, "--scale-procs"},
		{[]string{"bench", "--scale-procs", "1000"}, "--scale-procs"},
		{[]string{"bench", "--scale-shards", "0"}, "--scale-shards"},
		{[]string{"bench", "--scale-shards", "8", "--scale-merchants", "4"}, "--scale-merchants"},
		{[]string{"bench", "--only", "flor"}, "--only"},
		{[]string{"bench", "now"}, "unexpected argument"},
		{[]string{"bench", "--bogus"}, "bogus"},
		{[]string{"chaos", "--workers", "0"}, "--workers"},
		{[]string{"chaos", "--workers", "100000"}, "--workers"},
		{[]string{"chaos", "--duration", "-1s"}, "--duration"},
		{[]string{"chaos", "--merchants", "9223372036854775807"}, "--merchants"},
		{[]string{"chaos", "--bogus"}, "bogus"},
		{[]string{"chaos-worker", "--bogus"}, "bogus"},
	}
	for _, tt := range tests {
		r := runCLI(t, tt.args...)
		name := strings.Join(tt.args, " ")
		if r.code != 2 {
			t.Errorf("%s: exit %d, want 2 (usage); stderr:\n%s", name, r.code, truncateForLog(r.stderr))
			continue
		}
		if !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%s: the message does not name %q:\n%s", name, tt.want, truncateForLog(r.stderr))
		}
	}
}

// chaos and bench make databases of their own on the server the URL names (plain CREATE
// DATABASE, then migrate): a never-migrated database only tells them where the server is.
// Guards against: a schema guard that refuses the database a user's first run names.
func TestChaosAndBenchOnANeverMigratedDatabase(t *testing.T) {
	t.Run("chaos", func(t *testing.T) {
		t.Parallel()
		dbURL := testkit.EmptyDBURL(t)
		out, err := runBuilt(t, []string{"DATABASE_URL=" + dbURL}, "chaos", "--duration", "2s", "--workers", "1",
			"--merchants", "40", "--shards", "2", "--soak=false")
		require.NoError(t, err, out)
		require.Contains(t, out, "invariants")
	})
	t.Run("bench", func(t *testing.T) {
		t.Parallel()
		dbURL := testkit.EmptyDBURL(t)
		r := runCLI(t, "bench", "--database-url", dbURL, "--only", "floor,stepwise", "--rounds", "1", "--batches", "100",
			"--merchants", "200", "--max-items-b1", "10", "--river-items", "50")
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, "stepwise/floor B=100:")
	})
}

// The README's lab commands, run in the form it gives (docs/commands_test.go checks that each
// one is run somewhere): bounded on every CI run, at full size with STEPWISE_FULL=1.

func TestReadmeChaosCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("a chaos soak")
	}
	t.Parallel()
	testkit.Heavy(t) // a fleet of worker processes
	duration := "5s"
	if full() {
		duration = "10m"
	}
	// README: go run ./cmd/stepwise-lab chaos --profile mix --duration 10m
	out, err := runBuilt(t, nil, "chaos", "--profile", "mix", "--duration", duration)
	require.NoError(t, err, out)
	require.Contains(t, out, "all invariants hold")
}

// The README's bench command runs every section, small, against a real PostgreSQL with real
// worker processes, and its report has every section's shape: a section that breaks fails
// here, not in the lead's next benchmark run. The numbers themselves are not asserted (see
// the bench's targets). It is the one run of the whole bench in CI.
func TestReadmeBenchCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("a benchmark")
	}
	t.Parallel()
	testkit.Heavy(t) // every bench section, each with its River clients and pools
	// README: go run ./cmd/stepwise-lab bench --quick
	args := []string{"bench", "--quick"}
	if full() {
		// README: go run ./cmd/stepwise-lab bench
		args = []string{"bench"}
	}
	out, err := runBuilt(t, nil, args...)
	require.NoError(t, err, out)
	for _, section := range []string{"== settle:", "== settle, concurrent:", "== delivery:", "== reconcile:", "== takeover:",
		"== waits:", "== scale:", "== size:", "== history:", "== slowbank:", "== bigday:", "== targets"} {
		require.Contains(t, out, section)
	}
	// Every section says what memory it took, so a section that needs more than the machine
	// has shows which.
	for _, section := range []string{"settle", "delivery", "reconcile", "takeover", "maintenance", "waits", "scale", "size", "history"} {
		require.Regexp(t, "(?m)^"+section+`: peak RSS \d+ MiB \(`, out)
	}
	require.Contains(t, out, "step slowdown while pruning")
	require.Regexp(t, `(?m)^  enqueue +[\d,]+ -> +[\d,]+ B`, out, "the history section's WAL per item")
	// The depth of the ledger's indexes on each side: one thing a long ledger adds to an
	// insert with dated ids. Where the role may not install or call pageinspect (or the server
	// lacks it) the line says why instead; any other error fails the bench, and so this test.
	require.Regexp(t, `(?m)^B-tree pages a descent reads .*(; fresh -> history|: not read \((CREATE EXTENSION pageinspect|bt_metap): .*\))$`, out, "the history section's index depths")
	if !strings.Contains(out, "index pages, of stepwise_operation's indexes; fresh -> history: not read (") {
		for _, index := range []string{"pkey", "kind_business_key_key", "due_idx", "console_state_idx"} {
			require.Regexp(t, `(?m)^  stepwise_operation_`+index+` +[1-9]\d* -> [1-9]\d* +[\d,]+ -> +[\d,]+ pages$`, out, "the history section's index depths")
		}
	}
	// Each section says how far it got while it runs, not only at its end.
	require.Regexp(t, `bench: history: round (\d+)/\d+, history/fresh: step `, out)
	require.Regexp(t, `bench: settle: round \d+/\d+ B=100: floor `, out)
	require.Regexp(t, `bench: settle: concurrent round \d+/\d+: 8 loops `, out)
	require.Regexp(t, `Index (Only )?Scan using merchant_pkey on merchant`, out, "the settle statement's plan must reach merchants by their primary key")
	// This process's CPU beside the settle rates (getrusage, so on any Linux host): what a
	// variant spends beyond the other in the process is what its ratio pays on busy cores.
	procLine := `\d[\d.]*(ns|µs|ms|s) a merchant, \d+\.\d\d cores`
	require.Regexp(t, `(?m)^B=100\s+floor `+procLine+` · stepwise `+procLine+`$`, out, "the settle section's process CPU")
	require.Regexp(t, `(?m)^this process's CPU, median of the rounds: a8 `+procLine+` · b8 `+procLine+` · b1 `+procLine+`$`, out, "the concurrent part's process CPU")
	// The database's CPU beside each rate, for the figures per database core, where the
	// server runs on this host (as the tests' own server or throwaway cluster does).
	require.Regexp(t, `(?m)^database CPU: (read from /proc|not measured)`, out)
	if strings.Contains(out, "database CPU: read from /proc") {
		perCore := `\S+ a (merchant|payout|lookup), [\d,]+ per db core, \d+\.\d\d cores`
		require.Regexp(t, `(?m)^B=100\s+floor `+perCore+` · stepwise `+perCore+`$`, out, "the settle section's database CPU")
		require.Regexp(t, `(?m)^database CPU, median of the rounds: a8 `+perCore+` · b8 `, out, "the concurrent part's")
		require.Regexp(t, `(?m)^CPU a merchant, database and this process, median of the rounds: a8 \S+ · b8 \S+; cost a8/b8 \d+\.\d\d \(median of the rounds' pairs\), the b8/a8 the CPU allows$`, out,
			"the concurrent part's cost ratio: the rate ratio its work allows, beside the one measured")
		require.Regexp(t, `(?m)^database CPU, median of the 2 drains: `+perCore+`$`, out, "the delivery section's")
		require.Regexp(t, `(?m)^database CPU: `+perCore+`$`, out, "the reconcile section's")
		require.Regexp(t, `(?m)^1\s+[\d,]+\s+\S+\s+\d+\s+[\d,]+\s+\d+\.\d\d$`, out, "the scale section's row of 1 process")
		require.Regexp(t, `(?m)^  step +[\d.]+[µm]?s -> +[\d.]+[µm]?s +[\d,]+ -> +[\d,]+ /s$`, out, "the history section's database CPU per item")
		require.Regexp(t, `(?m)^  database cores busy: \d+\.\d\d in prune windows, \d+\.\d\d in quiet ones, the steps at \d+\.\d\d of their quiet rate while pruning;$`, out, "the prune's")
		require.Regexp(t, `(?m)^  the prune's own by difference: [+-]\d+\.\d\d cores, (within the noise|[\d,]+ rows per second of it \(per db core\))$`, out, "the prune's")
		require.Regexp(t, `(?m)^  whole day .*, database CPU (\S+ a payout, [\d,]+ per db core|under one clock tick \(10ms\) in all), \d+\.\d\d cores$`, out, "CompareTotals'")
	}
	// The lines for scripts: one per batch size, then concurrent=8, in that order.
	var last []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "stepwise/floor ") {
			last = append(last, l)
		}
	}
	require.Len(t, last, 4, "the ratio lines for scripts")
	for i, b := range []string{"1", "100", "1000"} {
		require.Regexp(t, `^stepwise/floor B=`+b+`: \d+\.\d\d$`, last[i])
	}
	require.Regexp(t, `^stepwise/floor concurrent=8: \d+\.\d\d$`, last[3])
}
