package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// A virtual machine's CPU can be taken by the hypervisor for other guests ("steal"): the
// machine is then slower than its cores say, and every rate of a section with it. The bench
// prints each section's share of stolen time, so that a slow section on a noisy host shows why.

// cpuTicks is the whole machine's CPU time so far, in clock ticks, from /proc/stat's first
// line: all of it, and the part stolen. ok is false where there is no such file.
func cpuTicks() (total, steal uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		// guest and guest_nice (fields 9 and 10) are already counted in user and nice.
		if i < 8 {
			total += v
		}
		if i == 7 {
			steal = v
		}
	}
	return total, steal, true
}

// stealWatch is the stolen share of the machine's CPU time since it started.
type stealWatch struct {
	total, steal uint64
	ok           bool
}

func startSteal() stealWatch {
	t, s, ok := cpuTicks()
	return stealWatch{t, s, ok}
}

// String is "CPU stolen by the host: 3.1% of the machine's CPU time", or "" where it cannot be
// read.
func (w stealWatch) String() string {
	t, s, ok := cpuTicks()
	if !w.ok || !ok || t <= w.total {
		return ""
	}
	return fmt.Sprintf("CPU stolen by the host: %.1f%% of the machine's CPU time (/proc/stat steal)", 100*float64(s-w.steal)/float64(t-w.total))
}
