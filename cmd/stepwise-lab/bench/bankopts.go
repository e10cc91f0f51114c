package bench

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// bankOptions are the flags of the slowbank and bigday sections: delivery and reconciliation
// against a bank that answers in tens or hundreds of milliseconds, as production's does.
type bankOptions struct {
	latencies    []time.Duration // bank latencies of the slowbank section
	concurrency  []int           // outbox KindConfig.Concurrency values of the slowbank section
	batch        int             // outbox KindConfig.BatchSize of the slowbank section (0: the default)
	window       time.Duration   // how long each slowbank measurement lasts at its limit
	bigdayOps    int             // payouts of the big day
	bigdayUnk    float64         // share of them UNKNOWN_EXTERNAL
	bigdayLat    time.Duration   // bank latency of the big day's lookups
	bigdayConc   []int           // reconcile KindConfig.Concurrency values of the bigday section
	bigdayWindow time.Duration   // how long each bigday measurement lasts at its limit

	latenciesFlag, concFlag, bigdayConcFlag string
}

func (b *bankOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&b.latenciesFlag, "slowbank-latencies", "50ms,200ms", "bank latencies of the slowbank section (each ±10% jitter)")
	fs.StringVar(&b.concFlag, "slowbank-concurrency", "16,256,1024", "outbox Concurrency values of the slowbank section")
	fs.IntVar(&b.batch, "slowbank-batch", 0, "outbox BatchSize of the slowbank section (0: outbox.BatchSizeDefault)")
	fs.DurationVar(&b.window, "slowbank-window", 8*time.Second, "how long each slowbank measurement lasts at its limit (sets the payouts per measurement)")
	fs.IntVar(&b.bigdayOps, "bigday-payouts", 1_000_000, "payouts of the bigday section's one business date (seeded set-based)")
	fs.Float64Var(&b.bigdayUnk, "bigday-unknown", 0.02, "share of the big day's payouts left UNKNOWN_EXTERNAL for the reconciler")
	fs.DurationVar(&b.bigdayLat, "bigday-latency", 100*time.Millisecond, "bank latency of the bigday section's lookups")
	fs.StringVar(&b.bigdayConcFlag, "bigday-concurrency", "8,64,256", "reconcile Concurrency values of the bigday section")
	fs.DurationVar(&b.bigdayWindow, "bigday-window", 8*time.Second, "how long each bigday measurement lasts at its limit (sets the lookups per measurement)")
}

// parse reads the list flags; quick shrinks what the user did not set.
func (b *bankOptions) parse(quick bool, set map[string]bool) error {
	if quick {
		if !set["slowbank-latencies"] {
			b.latenciesFlag = "50ms"
		}
		if !set["slowbank-concurrency"] {
			b.concFlag = "16,256"
		}
		if !set["slowbank-window"] {
			b.window = time.Second
		}
		if !set["bigday-payouts"] {
			b.bigdayOps = 20_000
		}
		if !set["bigday-concurrency"] {
			b.bigdayConcFlag = "8,64"
		}
		if !set["bigday-window"] {
			b.bigdayWindow = time.Second
		}
	}
	b.latencies = nil
	for _, f := range strings.Split(b.latenciesFlag, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d < time.Millisecond || d > time.Minute {
			return fmt.Errorf("bench: --slowbank-latencies: %q; want durations from 1ms to 1m such as 50ms,200ms", f)
		}
		b.latencies = append(b.latencies, d)
	}
	var err error
	if b.concurrency, err = parseInts("slowbank-concurrency", b.concFlag); err != nil {
		return err
	}
	if b.bigdayConc, err = parseInts("bigday-concurrency", b.bigdayConcFlag); err != nil {
		return err
	}
	switch {
	case len(b.latencies) == 0:
		return fmt.Errorf("bench: --slowbank-latencies is empty; give latencies such as 50ms,200ms")
	case len(b.concurrency) == 0 || len(b.bigdayConc) == 0:
		return fmt.Errorf("bench: --slowbank-concurrency and --bigday-concurrency need at least one value, such as 16,256")
	case b.batch < 0 || b.batch > maxBenchBatch:
		return fmt.Errorf("bench: --slowbank-batch %d: want 0 (the default) to %d", b.batch, maxBenchBatch)
	case b.window < 100*time.Millisecond || b.window > 10*time.Minute:
		return fmt.Errorf("bench: --slowbank-window %s: want 100ms to 10m", b.window)
	case b.bigdayWindow < 100*time.Millisecond || b.bigdayWindow > 10*time.Minute:
		return fmt.Errorf("bench: --bigday-window %s: want 100ms to 10m", b.bigdayWindow)
	case b.bigdayOps < 100 || b.bigdayOps > maxBenchItems:
		return fmt.Errorf("bench: --bigday-payouts %d: want 100 to %d", b.bigdayOps, maxBenchItems)
	case !(b.bigdayUnk > 0 && b.bigdayUnk <= 1):
		return fmt.Errorf("bench: --bigday-unknown %v: want a share above 0 and at most 1", b.bigdayUnk)
	case b.bigdayLat < time.Millisecond || b.bigdayLat > time.Minute:
		return fmt.Errorf("bench: --bigday-latency %s: want 1ms to 1m", b.bigdayLat)
	}
	for _, c := range append(append([]int(nil), b.concurrency...), b.bigdayConc...) {
		// Each concurrent send holds a connection to the fake bank on both ends: 2 file
		// descriptors in this process.
		if c < 1 || c > 4096 {
			return fmt.Errorf("bench: --slowbank-concurrency/--bigday-concurrency: %d; want 1 to 4096", c)
		}
	}
	return nil
}

// rssWatch reads this process's peak resident set size (VmHWM) and resets it at a section's
// start, so that each section reports its own peak, not the largest of those before it.
type rssWatch struct{ resetOK bool }

func newRSSWatch() *rssWatch {
	// Writing 5 to clear_refs resets VmHWM to the current RSS (Linux 4.0 and later).
	err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return &rssWatch{resetOK: err == nil}
}

// peak is the peak RSS since the watch began (since the process began where it cannot be
// reset), as text: "412 MiB" or "412 MiB (process peak)".
func (w *rssWatch) peak() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown (" + runtime.GOOS + ")"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return "unknown"
			}
			s := fmt.Sprintf("%d MiB", kb/1024)
			if !w.resetOK {
				s += " (process peak)"
			}
			return s
		}
	}
	return "unknown"
}

// loadAvg is the machine's 1-minute load average, printed beside each number: the bench
// shares the machine, and a rate means little without it.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// cpuTime is the CPU time this process used so far (user + system): the outbox, the fake
// bank's HTTP server and both ends of every connection, which share the machine's cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
