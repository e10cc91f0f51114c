package bench

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseBankFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{50 * time.Millisecond, 200 * time.Millisecond}, o.bank.latencies)
	require.Equal(t, []int{16, 256, 1024}, o.bank.concurrency)
	require.Equal(t, 1_000_000, o.bank.bigdayOps)
	require.True(t, o.runs("slowbank") && o.runs("bigday"))

	_, err = parseFlags([]string{"--quick", "--bigday-payouts", "5k"}, io.Discard)
	require.Error(t, err, "--bigday-payouts is a plain number")
	o, err = parseFlags([]string{"--quick", "--bigday-payouts", "5000", "--only", "bigday"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 5000, o.bank.bigdayOps, "an explicit flag wins over --quick")
	require.Equal(t, []int{16, 256}, o.bank.concurrency, "--quick shrinks what was not set")
	require.False(t, o.runs("slowbank"))

	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--slowbank-latencies", "50"}, "--slowbank-latencies"},
		{[]string{"--slowbank-latencies", ","}, "--slowbank-latencies is empty"},
		{[]string{"--slowbank-concurrency", "0"}, "want 1 to 4096"},
		{[]string{"--bigday-concurrency", "100000"}, "want 1 to 4096"},
		{[]string{"--bigday-unknown", "0"}, "--bigday-unknown"},
		{[]string{"--bigday-payouts", "20000000"}, "--bigday-payouts"},
		{[]string{"--slowbank-window", "1ms"}, "--slowbank-window"},
	} {
		_, err := parseFlags(tc.args, io.Discard)
		require.ErrorContains(t, err, tc.err, "%v", tc.args)
	}
}

// TestBankSectionsQuick runs the slowbank and bigday sections tiny against a real PostgreSQL
// and checks the report's shape: the limit beside each measure, statements per payout and
// the peak RSS.
func TestBankSectionsQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two bench sections, small: about 10s")
	}
	t.Parallel()
	var out, errw bytes.Buffer
	err := Main(context.Background(), []string{"--quick", "--only", "slowbank,bigday", "--merchants", "100",
		"--slowbank-concurrency", "16", "--slowbank-window", "300ms", "--bigday-payouts", "5000", "--bigday-window", "300ms"}, &out, &errw)
	require.NoError(t, err, "report:\n%s\nstderr:\n%s", out.String(), errw.String())
	report := out.String()
	require.Contains(t, report, "== slowbank:")
	// The limit is Concurrency / latency (320/s), or the mean of the zero-latency rates measured
	// just before and just after where a loaded machine made that lower (marked *).
	require.Regexp(t, `(?m)^50ms\s+16\s+\d+\s+\S+\s+(320|[\d,]+\*)\s+\d\.\d\d`, report, "the slow bank's row shows the limit Concurrency / latency")
	require.Regexp(t, `slowbank peak RSS: \d+ MiB`, report)
	if strings.Contains(report, "database CPU: read from /proc") {
		// The server's CPU per payout, payouts per second of it and its cores, beside this
		// process's.
		require.Regexp(t, `(?m)^50ms\s+16\s+.*\s\d+%\s+\S+\s+>?[\d,]+\s+\d+\.\d\d\s+\S+$`, report, "the slow bank's row shows the database's CPU")
		require.Regexp(t, `(?m)^\s+8\s+100\s+.*\s\d+%\s+\S+\s+>?[\d,]+\s+\d+\.\d\d\s+\S+$`, report, "the reconciler's row shows the database's CPU")
	}
	require.Contains(t, report, "== bigday: reconciling one date of 5,000 payouts, 100 UNKNOWN_EXTERNAL")
	require.Regexp(t, `(?m)^\s+8\s+100\s+\d+\s+\S+\s+(80|[\d,]+\*)\s+\d\.\d\d`, report, "the reconciler's row shows the limit Concurrency / latency")
	// The day's totals: every payout compared, the planted differences found (else Main
	// fails), the whole day beside a tenth of it.
	require.Contains(t, report, "CompareTotals of the day: 5,000 payouts against a statement of 5,002 entries")
	require.Regexp(t, `(?m)^  whole day\s+5,000 payouts\s+median \S+ \[\S+-\S+\] of 3 \(target <= 2s\), heap beyond the statement \d+\.\d MiB(, database CPU .+ cores)?$`, report)
	require.Regexp(t, `(?m)^  tenth\s+[\d,]+ payouts\s+median \S+`, report)
	require.Regexp(t, `(?m)^  [\d,]+ more payouts add -?\d+\.\d\d MiB beyond the statement`, report)
	require.Regexp(t, `bigday peak RSS: \d+ MiB`, report)
	require.Contains(t, errw.String(), "bench: slowbank: latency 50ms, concurrency 16: ")
	require.Contains(t, errw.String(), "bench: bigday: concurrency 8, batch 100: ")
}

func TestRatioAgainstShowsWhatRoundingWouldHide(t *testing.T) {
	for _, c := range []struct {
		ratio, limit float64
		want         string
	}{{0.948, 0.95, "0.948"}, {0.953, 0.95, "0.953"}, {0.95, 0.95, "0.95"}, {0.93, 0.95, "0.93"}, {1.004, 1, "1.004"}, {0.897, 0.90, "0.897"}} {
		if got := ratioAgainst(c.ratio, c.limit); got != c.want {
			t.Errorf("ratioAgainst(%v, %v) = %q, want %q", c.ratio, c.limit, got, c.want)
		}
	}
}
