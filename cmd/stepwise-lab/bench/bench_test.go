package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		// A worker process started by a takeover or scale section run from a test here: the
		// test binary re-executed, as the lab binary is in the README's bench command
		// (cmd/stepwise-lab's TestReadmeBenchCommand runs every section).
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := runRole(ctx, role, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(testkit.Main(m))
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, o *options)
		err   string
	}{
		{name: "defaults", check: func(t *testing.T, o *options) {
			require.Equal(t, 20000, o.merchants)
			require.Equal(t, []int{1, 100, 1000}, o.batches)
			require.Equal(t, []int{10000, 100000, 1000000}, o.sizes)
			require.Equal(t, 20, o.kills)
			require.True(t, o.runs("takeover"))
			require.GreaterOrEqual(t, o.rounds, minPairedRounds, "a headline ratio is the median of at least 9 paired rounds")
			require.Equal(t, 10_000_000, o.historyOps)
			require.Equal(t, 1_000_000, o.historyRuns)
			require.True(t, o.runs("history"))
		}},
		{name: "quick shrinks what was not set", args: []string{"--quick", "--merchants", "7000"}, check: func(t *testing.T, o *options) {
			require.Equal(t, 7000, o.merchants, "an explicit flag wins over --quick")
			require.Equal(t, 2, o.kills)
			require.Equal(t, 1, o.rounds)
			require.Equal(t, []int{1000, 5000}, o.sizes)
			require.Equal(t, 100, o.sizeBatch, "ten steps at the smallest size, so that one is timed")
			require.Equal(t, 30_000, o.historyOps)
			require.Equal(t, 3_000, o.historyRuns)
		}},
		{name: "history runs without operations", args: []string{"--history-ops", "10", "--history-runs", "20"}, err: "want at least one operation per run"},
		{name: "lists with suffixes", args: []string{"--sizes", "10k,1M", "--batches", "1_000"}, check: func(t *testing.T, o *options) {
			require.Equal(t, []int{10000, 1000000}, o.sizes)
			require.Equal(t, []int{1000}, o.batches)
		}},
		{name: "only", args: []string{"--only", "floor, stepwise"}, check: func(t *testing.T, o *options) {
			require.True(t, o.runs("floor"))
			require.False(t, o.runs("river"))
		}},
		{name: "unknown section", args: []string{"--only", "flor"}, err: `unknown section "flor"`},
		{name: "size under two steps", args: []string{"--sizes", "1000,5000", "--size-batch", "1000"}, err: "1000 merchants with --size-batch 1000 is under two steps a run"},
		{name: "size under two steps, not run", args: []string{"--sizes", "1000", "--size-batch", "1000", "--only", "floor"}, check: func(t *testing.T, o *options) {
			require.False(t, o.runs("size"))
		}},
		{name: "bad list", args: []string{"--batches", "1,x"}, err: `--batches: "x" is not a number`},
		{name: "zero batch", args: []string{"--batches", "0"}, err: "0 is not a batch size"},
		{name: "one takeover process", args: []string{"--takeover-procs", "1"}, err: "want 2 to 64"},
		{name: "maintenance", args: []string{"--takeover-maintenance", "nowhere"}, err: "want every"},
		{name: "stray argument", args: []string{"now"}, err: `unexpected argument "now"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tc.args, io.Discard)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			tc.check(t, o)
		})
	}
}

func TestMainUsageErrors(t *testing.T) {
	t.Parallel()
	err := Main(context.Background(), []string{"--rounds", "0"}, io.Discard, io.Discard)
	require.ErrorIs(t, err, ErrUsage)
	require.ErrorContains(t, err, "--rounds 0")
	require.NoError(t, Main(context.Background(), []string{"--help"}, io.Discard, io.Discard), "--help is not an error")
}

func TestGroupThousands(t *testing.T) {
	t.Parallel()
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		require.Equal(t, want, groupThousands(in))
	}
}

func TestOwnerPid(t *testing.T) {
	t.Parallel()
	pid, ok := ownerPid("bench-worker-4242/job-7/attempt-1")
	require.True(t, ok)
	require.Equal(t, 4242, pid)
	_, ok = ownerPid("host_2026/job-7/attempt-1")
	require.False(t, ok)
}

func TestCheckFailsOnMissedTarget(t *testing.T) {
	t.Parallel()
	r := &runner{opts: &options{}, out: io.Discard}
	r.check(true, "fine")
	r.check(false, "not fine")
	require.Len(t, r.targets, 2)
	require.False(t, r.targets[1].met)
	require.True(t, errors.Is(fmt.Errorf("%w: 1 of 2", ErrTargetMissed), ErrTargetMissed))
}

// The sweep of killed benches' databases drops only those this host's benches left: tagged
// with this host and a pid that no longer runs, nobody connected. On a server shared by
// several machines or containers a pid names another process, and a database of a bench
// still running elsewhere was dropped under it (the old sweep judged the pid in the name).
func TestSweepDropsOnlyThisHostsDeadBenches(t *testing.T) {
	ctx := context.Background()
	srv, err := newServer(ctx, testkit.DBURL(t), false)
	require.NoError(t, err)
	t.Cleanup(func() { srv.close() })
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	dead := gone.Process.Pid
	srv.prefix = fmt.Sprintf("stepwise_bench_%d_%d", dead, os.Getpid()%100000) // as a killed bench named them
	host, err := os.Hostname()
	require.NoError(t, err)
	tags := map[string]string{
		"ours_dead":  fmt.Sprintf("sample-settlement bench: host=%s pid=%d", host, dead),
		"other_host": fmt.Sprintf("sample-settlement bench: host=%s-elsewhere pid=%d", host, dead),
		"ours_alive": fmt.Sprintf("sample-settlement bench: host=%s pid=%d", host, os.Getpid()),
		"untagged":   "",
		"kept":       "kept by sample-settlement bench --keep",
	}
	names := map[string]string{}
	for suffix, tag := range tags {
		name, _, err := srv.create(ctx, suffix, "")
		require.NoError(t, err)
		comment := "NULL"
		if tag != "" {
			comment = quoteLiteral(tag)
		}
		_, err = srv.admin.Exec(ctx, "COMMENT ON DATABASE "+name+" IS "+comment)
		require.NoError(t, err)
		names[suffix] = name
	}
	srv.sweep(ctx)
	for suffix, name := range names {
		var exists bool
		require.NoError(t, srv.admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists))
		require.Equal(t, suffix != "ours_dead", exists, "database %s (%s) after the sweep", name, suffix)
	}
}

// TestStealLine: on Linux the machine's CPU time and its stolen part are read from
// /proc/stat, and a section's line says what share was stolen.
func TestStealLine(t *testing.T) {
	total, steal, ok := cpuSeconds()
	if !ok {
		t.Skip("no /proc/stat here")
	}
	if total == 0 || steal > total {
		t.Fatalf("cpuSeconds: total %g, steal %g", total, steal)
	}
	w := startSteal()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if t2, _, _ := cpuSeconds(); t2 > w.total {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := w.String(); !regexp.MustCompile(`^CPU stolen by the host: \d+\.\d% of the machine's CPU time \(/proc/stat steal\)$`).MatchString(got) {
		t.Fatalf("steal line %q", got)
	}
}

// The median's interval is the order statistics the binomial gives (a table value for 9 and
// 15 rounds), and a target line says when its interval holds the target.
func TestMedianInterval(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // reversed: the interval must come from the sorted values
		}
		return xs
	}
	for _, c := range []struct {
		n      int
		lo, hi float64
		ok     bool
	}{{5, 0, 0, false}, {6, 1, 6, true}, {9, 2, 8, true}, {15, 4, 12, true}, {20, 6, 15, true}} {
		lo, hi, ok := medianInterval(seq(c.n))
		require.Equal(t, c.ok, ok, "n=%d", c.n)
		require.Equal(t, []float64{c.lo, c.hi}, []float64{lo, hi}, "n=%d", c.n)
	}
	require.Equal(t, "; its 95% interval 0.96-1.04", medianNoise([]float64{1.04, 0.96, 1, 1, 1, 1.1, 0.9, 1, 1}, 0.95))
	require.Equal(t, "; its 95% interval 0.90-1.04 holds the target: noise can decide this line",
		medianNoise([]float64{1.04, 0.90, 1, 1, 1, 1.1, 0.8, 1, 1}, 0.95))
	require.Equal(t, "; its 95% interval 0.80-0.91", medianNoise([]float64{0.94, 0.80, 0.9, 0.9, 0.9, 0.91, 0.7, 0.9, 0.9}, 0.95),
		"an interval wholly below the target is a miss the noise cannot explain")
	require.Equal(t, "; its 95% interval 0.95-1.04", medianNoise([]float64{1.04, 0.95, 1, 1, 1, 1.1, 0.9, 1, 1}, 0.95),
		"an interval that starts at the target does not hold it below")
	require.Equal(t, "; its 95% interval 0.949-1.04 holds the target: noise can decide this line",
		medianNoise([]float64{1.04, 0.949, 1, 1, 1, 1.1, 0.9, 1, 1}, 0.95), "an end that rounds onto the target shows a third decimal")
	require.Equal(t, "", medianNoise([]float64{1, 1, 1}, 0.95))
	// Past 1,074 rounds 0.5^n underflows; the interval must still be the middle of the values.
	lo, hi, ok := medianInterval(seq(2000))
	require.True(t, ok)
	require.Greater(t, hi, lo)
	require.InDelta(t, 1000, (lo+hi)/2, 2)
	require.InDelta(t, 2*1.96*math.Sqrt(2000)/2, hi-lo, 5, "about 1.96 standard deviations of Binomial(n, ½) either side")
}

// machineCost pairs the two variants' rounds and leaves out a round either did not measure.
func TestMachineCost(t *testing.T) {
	m := func(db, proc time.Duration) measurement { return measurement{items: 1000, db: db, proc: proc} }
	a := []measurement{m(90*time.Millisecond, 10*time.Millisecond), m(-1, 10*time.Millisecond), m(180*time.Millisecond, 20*time.Millisecond)}
	b := []measurement{m(100*time.Millisecond, 25*time.Millisecond), m(100*time.Millisecond, 10*time.Millisecond), m(190*time.Millisecond, 10*time.Millisecond)}
	ac, bc, ratio, ok := machineCost(a, b)
	require.True(t, ok)
	require.InDelta(t, 150e-6, ac, 1e-9, "the median of 100 and 200 µs a merchant")
	require.InDelta(t, 162.5e-6, bc, 1e-9)
	require.InDelta(t, (0.8+1.0)/2, ratio, 1e-9, "the median of the rounds' own ratios, not the ratio of the medians")
	_, _, _, ok = machineCost([]measurement{m(-1, time.Millisecond)}, b[:1])
	require.False(t, ok, "no round measured both")
}
