package bench

import (
	"fmt"

	"github.com/prometheus/procfs"
)

// A virtual machine's CPU can be taken by the hypervisor for other guests ("steal"): the
// machine is then slower than its cores say, and every rate of a section with it. The bench
// prints each section's share of stolen time, so that a slow section on a noisy host shows why.

// cpuSeconds is the whole machine's CPU time so far, from /proc/stat's first line (read by
// procfs, which the module already has through the Prometheus client): all of it, and the
// part stolen. ok is false where there is no such file.
func cpuSeconds() (total, steal float64, ok bool) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0, false
	}
	st, err := fs.Stat()
	if err != nil {
		return 0, 0, false
	}
	c := st.CPUTotal
	// Guest and GuestNice are already counted in User and Nice.
	return c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal, c.Steal, true
}

// stealWatch is the stolen share of the machine's CPU time since it started.
type stealWatch struct {
	total, steal float64
	ok           bool
}

func startSteal() stealWatch {
	t, s, ok := cpuSeconds()
	return stealWatch{t, s, ok}
}

// String is "CPU stolen by the host: 3.1% of the machine's CPU time (/proc/stat steal)", or ""
// where it cannot be read.
func (w stealWatch) String() string {
	t, s, ok := cpuSeconds()
	if !w.ok || !ok || t <= w.total {
		return ""
	}
	return fmt.Sprintf("CPU stolen by the host: %.1f%% of the machine's CPU time (/proc/stat steal)", 100*(s-w.steal)/(t-w.total))
}
