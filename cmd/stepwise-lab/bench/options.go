package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Sections are the parts of the bench, in the order they run. --only picks some of them.
var Sections = []string{"floor", "stepwise", "river", "concurrent", "delivery", "reconcile", "takeover", "maintenance", "waits", "scale", "size", "slowbank", "bigday", "history"}

// options are the bench's flags after defaults (and --quick) were applied.
type options struct {
	merchants           int
	batches             []int
	maxItemsB1          int
	riverItems          int
	riverWorkers        int
	rounds              int
	only                map[string]bool
	sizes               []int
	sizeBatch           int
	quick               bool
	databaseURL         string
	keep                bool
	kills               int
	lease               time.Duration
	deliveryOps         int
	reconcileOps        int
	scaleProcs          []int
	scaleShards         int
	scaleItems          int
	cpuProfile          string
	trace               bool
	check               bool
	verbose             bool
	setFlags            map[string]bool
	poolConns           int32
	takeoverProcs       int
	takeoverMaintenance string
	bank                bankOptions // the slowbank and bigday sections (bankopts.go)

	// The waits section (waits.go).
	waitsRuns, waitsWakes int

	// The history section (history.go).
	historyOps, historyRuns, historyMerchants, historyRounds int
	historyPruneBatch                                        int
	historyWindow, historyPruneFor                           time.Duration
}

const usageText = `Usage: stepwise-lab bench [flags]

Measures Stepwise against the plain-pgx floor, in one process, on a fresh database of its
own (created on the server pgserver finds: $TEST_DATABASE_URL, $DATABASE_URL, 127.0.0.1:5432,
or a throwaway cluster; dropped at the end).

The settle step is settlement.SettleBatch, the sample's own code: per merchant one sum over
its card transactions, one settlement row, two ledger rows and one payout in the operation
ledger. It runs three ways on identical data:

  floor (a)     plain pgx: BEGIN; SettleBatch; fenced cursor UPDATE; COMMIT, in a loop.
  stepwise (b)  settlement.SettleWorker as a Stepwise workflow in a River client: claim,
                fenced steps, cursor, run status, dispatcher wake, River job completion.
  concurrent    one date in 8 shards: 8 Stepwise runs at once vs 8 floor loops at once vs
                1 Stepwise run (B=100), in this process.
  river (c)     one River job per merchant (SettleBatch of 1 + JobCompleteTx): what a River
                user writes without Stepwise. Shown at River's default fetch settings and
                with a 5ms FetchCooldown.

How to read it: items/s are merchants settled per second, the best of --rounds runs of each
variant, every run on a fresh business date with identical data. b/a is stepwise over floor,
the median of the rounds' paired ratios (in each round the two run back to back, so they met
about the same load from the rest of the machine), with their range: 1.00 means Stepwise
costs nothing over the hand-written loop; the target is >= 0.95 at every B, over 15 rounds (at least 9); a wide
range means a busy machine. b/c compares a Stepwise step of B
merchants with one River job per merchant (target >= 10 at B=100). The last lines are
"stepwise/floor B=<n>: <ratio>", one per batch size, and "stepwise/floor concurrent=8:
<ratio>", for scripts. Each round prints a progress line on stderr.

Flags:
`

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                                options
		batches, only, sizes, scaleProcs string
	)
	fs.IntVar(&o.merchants, "merchants", 20000, "merchants settled per run (each with 5 card transactions of the day)")
	fs.StringVar(&batches, "batches", "1,100,1000", "batch sizes B: merchants per step (and per floor transaction)")
	fs.IntVar(&o.maxItemsB1, "max-items-b1", 2000, "cap on merchants per run at B=1 (one merchant per step is slow; the output says when it applied)")
	fs.IntVar(&o.riverItems, "river-items", 3000, "merchants (= River jobs) per one-job-per-merchant run")
	fs.IntVar(&o.riverWorkers, "river-workers", 100, "MaxWorkers of the one-job-per-merchant River queue")
	fs.IntVar(&o.rounds, "rounds", defaultRounds, "rounds of the settle section: each runs the floor and Stepwise back to back at every batch size (and, in the first 3, River per merchant)")
	fs.StringVar(&only, "only", "", "comma-separated sections to run, of "+strings.Join(Sections, ",")+" (default all)")
	fs.StringVar(&sizes, "sizes", "10000,100000,1000000", "merchant counts of the size section (seeded set-based; 1M takes about a minute)")
	fs.IntVar(&o.sizeBatch, "size-batch", 1000, "batch size of the size section")
	fs.BoolVar(&o.quick, "quick", false, "run every section small (about a minute in all), for CI; explicit flags still win")
	fs.StringVar(&o.databaseURL, "database-url", "", "server to create the bench's databases on (a URL whose user may create databases); default: found by pgserver")
	fs.BoolVar(&o.keep, "keep", false, "keep the bench's databases instead of dropping them, to inspect them afterwards")
	fs.IntVar(&o.kills, "kills", 20, "kill -9s of the takeover section")
	fs.DurationVar(&o.lease, "lease", time.Second, "workflow lease of the takeover section's workers")
	fs.IntVar(&o.takeoverProcs, "takeover-procs", 3, "worker processes of the takeover section")
	fs.StringVar(&o.takeoverMaintenance, "takeover-maintenance", "every", "where takeover maintenance runs: \"every\" worker process, as the stepwise.Client runs it (the only choice since the service runs on the client)")
	fs.IntVar(&o.deliveryOps, "delivery-ops", 20000, "payouts delivered by the delivery section")
	fs.IntVar(&o.reconcileOps, "reconcile-ops", 5000, "UNKNOWN_EXTERNAL payouts looked up by the reconcile section")
	fs.StringVar(&scaleProcs, "scale-procs", "1,2,4", "worker process counts of the scale section")
	fs.IntVar(&o.scaleShards, "scale-shards", 8, "shards (runs) the scale section's merchants are split into")
	fs.IntVar(&o.scaleItems, "scale-merchants", 40000, "merchants settled per scale run")
	fs.IntVar(&o.waitsRuns, "waits-runs", 10_000, "runs waiting for a signal (seeded set-based) while the waits section times maintenance passes and idle statements")
	fs.IntVar(&o.waitsWakes, "waits-wakes", 200, "runs the waits section wakes by a signal, one at a time, for the wake latency")
	fs.IntVar(&o.historyOps, "history-ops", 10_000_000, "operations of the history section's long ledger (seeded set-based; 10M take several minutes)")
	fs.IntVar(&o.historyRuns, "history-runs", 1_000_000, "runs of the history section's long ledger")
	fs.IntVar(&o.historyMerchants, "history-merchants", 5000, "merchants per Stepwise run of the history section (and payouts per delivery)")
	fs.IntVar(&o.historyRounds, "history-rounds", 9, "paired rounds (fresh and history database) of the history section")
	fs.IntVar(&o.historyPruneBatch, "history-prune-batch", 0, "retention.Config.BatchSize of the history section's pruning (0: the package's default)")
	fs.DurationVar(&o.historyWindow, "history-window", 2*time.Second, "length of each prune window and of the quiet window paired with it")
	fs.DurationVar(&o.historyPruneFor, "history-prune-for", 30*time.Minute, "most time spent in prune windows; the rest of the history is left and the report estimates it")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process during the floor/stepwise/river section to `file` (go tool pprof)")
	fs.BoolVar(&o.trace, "trace", false, "instead of the timed rounds, run each settle variant once per batch size with every statement traced, and print where a step's time goes")
	fs.BoolVar(&o.check, "check", false, "exit with an error when this run misses one of the bench's targets (listed before the last lines)")
	fs.BoolVar(&o.verbose, "v", false, "log progress to stderr")
	o.bank.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, fmt.Errorf("bench: unexpected argument %q; all settings are flags", fs.Arg(0))
	}
	o.setFlags = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.setFlags[f.Name] = true })
	var err error
	if o.batches, err = parseInts("batches", batches); err != nil {
		return nil, err
	}
	if o.sizes, err = parseInts("sizes", sizes); err != nil {
		return nil, err
	}
	if o.scaleProcs, err = parseInts("scale-procs", scaleProcs); err != nil {
		return nil, err
	}
	if o.only, err = parseOnly(only); err != nil {
		return nil, err
	}
	if o.quick {
		o.applyQuick()
	}
	if err := o.bank.parse(o.quick, o.setFlags); err != nil {
		return nil, err
	}
	o.poolConns = 20
	return &o, o.validate()
}

// applyQuick shrinks every section that the user did not size explicitly. --quick is CI's
// smoke run of every section (the README's `bench --quick`), not a measurement: one round,
// a few thousand rows. With 3 rounds and 5,000 merchants it took about 5 minutes of CI's
// 15 on two cores; at these sizes every section still runs each of its code paths.
func (o *options) applyQuick() {
	set := func(name string, apply func()) {
		if !o.setFlags[name] {
			apply()
		}
	}
	set("merchants", func() { o.merchants = 1500 })
	set("max-items-b1", func() { o.maxItemsB1 = 150 })
	set("river-items", func() { o.riverItems = 300 })
	set("rounds", func() { o.rounds = 1 })
	set("sizes", func() { o.sizes = []int{1000, 5000} })
	set("size-batch", func() { o.sizeBatch = 100 })
	set("kills", func() { o.kills = 2 })
	set("delivery-ops", func() { o.deliveryOps = 1000 })
	set("reconcile-ops", func() { o.reconcileOps = 500 })
	set("scale-procs", func() { o.scaleProcs = []int{1, 2} })
	set("scale-merchants", func() { o.scaleItems = 3000 })
	set("waits-wakes", func() { o.waitsWakes = 40 })
	set("history-ops", func() { o.historyOps = 30_000 })
	set("history-runs", func() { o.historyRuns = 3_000 })
	set("history-merchants", func() { o.historyMerchants = 300 })
	set("history-rounds", func() { o.historyRounds = 2 })
	set("history-window", func() { o.historyWindow = 400 * time.Millisecond })
	set("history-prune-for", func() { o.historyPruneFor = 2 * time.Second })
}

// Upper bounds of the bench's flags. Guards against a typo (an extra zero, a negative
// number read as huge) that would seed billions of rows, start thousands of processes or
// run for days before anything is printed.
const (
	maxBenchItems  = 10_000_000
	maxBenchRounds = 1000
	maxBenchProcs  = 64
	maxBenchBatch  = 100_000
)

func (o *options) validate() error {
	ints := []struct {
		name   string
		v      int
		lo, hi int
		why    string
	}{
		{"merchants", o.merchants, 1, maxBenchItems, ""},
		{"max-items-b1", o.maxItemsB1, 1, maxBenchItems, ""},
		{"river-items", o.riverItems, 1, maxBenchItems, ""},
		{"river-workers", o.riverWorkers, 1, 10_000, ""},
		{"rounds", o.rounds, 1, maxBenchRounds, ""},
		{"kills", o.kills, 1, maxBenchRounds, ""},
		{"takeover-procs", o.takeoverProcs, 2, maxBenchProcs, " (one is killed, another takes over)"},
		{"delivery-ops", o.deliveryOps, 1, maxBenchItems, ""},
		{"reconcile-ops", o.reconcileOps, 1, maxBenchItems, ""},
		{"scale-shards", o.scaleShards, 1, 1024, ""},
		{"scale-merchants", o.scaleItems, 1, maxBenchItems, ""},
		{"size-batch", o.sizeBatch, 1, maxBenchBatch, ""},
		{"waits-runs", o.waitsRuns, 1, maxBenchItems, ""},
		{"waits-wakes", o.waitsWakes, 1, 100_000, ""},
		{"history-ops", o.historyOps, 1, 10 * maxBenchItems, ""},
		{"history-runs", o.historyRuns, 1, maxBenchItems, ""},
		{"history-merchants", o.historyMerchants, 1, maxBenchItems, ""},
		{"history-rounds", o.historyRounds, 1, maxBenchRounds, ""},
		{"history-prune-batch", o.historyPruneBatch, 0, 10000, " (0: retention's default)"},
	}
	for _, c := range ints {
		if c.v < c.lo || c.v > c.hi {
			return fmt.Errorf("bench: --%s %d: want %d to %d%s", c.name, c.v, c.lo, c.hi, c.why)
		}
	}
	switch {
	case len(o.batches) == 0:
		return errors.New("bench: --batches is empty; give batch sizes such as 1,100,1000")
	case len(o.sizes) == 0 && o.runs("size"):
		return errors.New("bench: --sizes is empty; give merchant counts such as 10000,100000")
	case len(o.scaleProcs) == 0 && o.runs("scale"):
		return errors.New("bench: --scale-procs is empty; give process counts such as 1,2,4")
	case o.lease < 100*time.Millisecond || o.lease > time.Hour:
		return fmt.Errorf("bench: --lease %s: want 100ms to 1h", o.lease)
	case o.takeoverMaintenance == "leader":
		return fmt.Errorf("bench: --takeover-maintenance leader: the service runs on stepwise.Client, whose maintenance loop runs in every process, so a leader-only takeover can no longer be measured here; use every")
	case o.takeoverMaintenance != "every":
		return fmt.Errorf("bench: --takeover-maintenance %q: want every", o.takeoverMaintenance)
	case o.historyWindow < 100*time.Millisecond || o.historyWindow > time.Hour:
		return fmt.Errorf("bench: --history-window %s: want 100ms to 1h", o.historyWindow)
	case o.historyPruneFor < 0:
		return fmt.Errorf("bench: --history-prune-for %s: want 0 or more", o.historyPruneFor)
	case o.historyRuns > o.historyOps:
		return fmt.Errorf("bench: --history-runs %d, --history-ops %d: want at least one operation per run", o.historyRuns, o.historyOps)
	case o.scaleItems < o.scaleShards:
		return fmt.Errorf("bench: --scale-shards %d, --scale-merchants %d: want a merchant per shard at least", o.scaleShards, o.scaleItems)
	}
	for _, b := range o.batches {
		if b < 1 || b > maxBenchBatch {
			return fmt.Errorf("bench: --batches: %d is not a batch size; want 1 to %d", b, maxBenchBatch)
		}
	}
	for _, s := range o.sizes {
		if s < 1 || s > 100_000_000 {
			return fmt.Errorf("bench: --sizes: %d merchants; want 1 to 100,000,000", s)
		}
		// The size section times a step as the interval between two step starts of a run.
		if o.runs("size") && s < 2*o.sizeBatch {
			return fmt.Errorf("bench: --sizes: %d merchants with --size-batch %d is under two steps a run, and a step is timed between two; want sizes of at least %d, or a smaller --size-batch",
				s, o.sizeBatch, 2*o.sizeBatch)
		}
	}
	for _, p := range o.scaleProcs {
		if p < 1 || p > maxBenchProcs {
			return fmt.Errorf("bench: --scale-procs: %d processes; want 1 to %d", p, maxBenchProcs)
		}
	}
	return nil
}

// runs reports whether section is selected.
func (o *options) runs(section string) bool { return len(o.only) == 0 || o.only[section] }

func parseInts(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ReplaceAll(f, "_", ""))
		if f == "" {
			continue
		}
		mult := 1
		switch {
		case strings.HasSuffix(f, "k"):
			mult, f = 1000, strings.TrimSuffix(f, "k")
		case strings.HasSuffix(f, "M"):
			mult, f = 1_000_000, strings.TrimSuffix(f, "M")
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("bench: --%s: %q is not a number; want a list such as 1,100,1000", name, f)
		}
		// A count beyond an int's range once multiplied (9223372036854775807k) would wrap
		// around to a small or negative number and slip past the bounds.
		if n > math.MaxInt/mult || n < math.MinInt/mult {
			return nil, fmt.Errorf("bench: --%s: %s%s is out of range; want a list such as 1,100,1000", name, f, map[int]string{1000: "k", 1_000_000: "M"}[mult])
		}
		out = append(out, n*mult)
	}
	return out, nil
}

func parseOnly(s string) (map[string]bool, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(Sections, f) {
			return nil, fmt.Errorf("bench: --only: unknown section %q; sections are %s", f, strings.Join(Sections, ","))
		}
		out[f] = true
	}
	return out, nil
}
