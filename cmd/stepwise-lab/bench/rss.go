package bench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Peak memory per section, so a section that needs more than the machine has shows which.
// The peak resident set of this process over a section is VmHWM of /proc/self/status after
// the section, with the high-water mark reset at its start by writing 5 to
// /proc/self/clear_refs (Linux 4.0 and later). Where that reset is refused,
// the peak is getrusage's ru_maxrss, the peak since the process started, and the report says
// so. Worker processes (takeover, scale) are reported as the largest child's ru_maxrss since
// the bench started (RUSAGE_CHILDREN: children that were waited for). PostgreSQL's own
// memory is the server's and not counted.

// peakMeter measures one section's peak RSS.
type peakMeter struct {
	reset bool // the high-water mark was reset at the section's start
}

func startPeak() peakMeter {
	err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return peakMeter{reset: err == nil}
}

// String reports the section's peak, and how it was measured.
func (p peakMeter) String() string {
	var self string
	if kb, ok := procStatusKB("VmHWM"); ok && p.reset {
		self = fmt.Sprintf("%s (VmHWM of this process, reset at the section's start)", fmtKB(kb))
	} else {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		self = fmt.Sprintf("%s (getrusage maxrss of this process since it started: the section's own peak could not be isolated)", fmtKB(ru.Maxrss))
	}
	var ch syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ch) == nil && ch.Maxrss > 0 {
		self += fmt.Sprintf("; largest worker process so far %s (getrusage RUSAGE_CHILDREN maxrss)", fmtKB(ch.Maxrss))
	}
	return self
}

// rssNow is this process's resident set now, for progress lines.
func rssNow() string {
	if kb, ok := procStatusKB("VmRSS"); ok {
		return fmtKB(kb)
	}
	return "?"
}

func procStatusKB(field string) (int64, bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != field {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return n, err == nil
	}
	return 0, false
}

func fmtKB(kb int64) string { return fmt.Sprintf("%.0f MiB", float64(kb)/1024) }
