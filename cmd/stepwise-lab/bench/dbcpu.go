package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The database's CPU time, for the figures "per database core". A rate per process says what
// one process reached with the database on the same two cores; a rate per core-second of the
// database says what each core given to PostgreSQL buys, which is what sizing a database
// server needs.
//
// When the server runs on this host, the CPU time of its processes is read from /proc: the
// postmaster's own and its reaped children's (utime, stime, cutime, cstime of
// /proc/<postmaster>/stat) plus the live children's own (backends, the WAL writer, the
// checkpointer, the background writer). A backend that exits between two readings moves from
// the live sum into the postmaster's reaped time with all of it, so the difference of two
// readings is what the server used between them, whichever processes used it. It counts
// every database of the server: the bench's sections run one at a time, and the figures hold
// only while nothing else uses the server (nothing checks that; the header line says it). CPU time is not the whole cost of a
// commit: the wait for the WAL flush uses none, which is why B=1 reads far more merchants a
// database core-second than its wall rate.
//
// Elsewhere (a server on another host or in another PID namespace) the figures are "-".

// serverCPU reads the CPU time of a PostgreSQL server on this host.
type serverCPU struct {
	postmaster int
}

// clockTick is the unit of /proc's times: USER_HZ, 100 on every Linux the bench runs on.
const clockTick = 10 * time.Millisecond

// findServerCPU finds the server behind pool among this host's processes, or says why the
// server's CPU time cannot be read.
func findServerCPU(ctx context.Context, pool *pgxpool.Pool) (*serverCPU, string) {
	var (
		pid     int
		addr    *string
		started time.Time
	)
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid(), host(inet_server_addr()), pg_postmaster_start_time()`).Scan(&pid, &addr, &started); err != nil {
		return nil, fmt.Sprintf("asking the server for its process id: %v", err)
	}
	// A Unix socket (addr NULL) or a loopback address: the server is on this host, unless it
	// runs in a container of its own (then the pid below is not its backend, which the
	// postmaster's start time shows).
	if addr != nil {
		if ip := net.ParseIP(*addr); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Sprintf("the server is reached at %s, not over loopback or a Unix socket", *addr)
		}
	}
	isPostgres := func(st procStat) bool { return st.comm == "postgres" || st.comm == "postmaster" }
	backend, err := readProcStat(pid)
	if err != nil || !isPostgres(backend) {
		return nil, fmt.Sprintf("the server's backend (pid %d) is not a process of this host", pid)
	}
	pm, err := readProcStat(backend.ppid)
	if err != nil || !isPostgres(pm) {
		return nil, fmt.Sprintf("the parent of the server's backend (pid %d) is not its postmaster", backend.ppid)
	}
	boot, err := bootTime()
	if err != nil {
		return nil, err.Error()
	}
	// The process's start and the server's own record of it differ by the postmaster's
	// start-up, well under seconds; another server's, or another namespace's process, by far
	// more.
	if d := boot.Add(time.Duration(pm.starttime) * clockTick).Sub(started); d < -5*time.Second || d > 5*time.Second {
		return nil, fmt.Sprintf("process %d started %s apart from the server's postmaster: not the same process", backend.ppid, d.Round(time.Second))
	}
	s := &serverCPU{postmaster: backend.ppid}
	if _, err := s.total(); err != nil {
		return nil, err.Error()
	}
	return s, ""
}

// total is the CPU time the server's processes used since the postmaster started.
func (s *serverCPU) total() (time.Duration, error) {
	// A child reaped while the children are read would be counted twice (live, then in the
	// postmaster's reaped time) or not at all: read again when the reaped time moved.
	for try := range 50 {
		if try > 0 {
			time.Sleep(time.Millisecond)
		}
		before, err := readProcStat(s.postmaster)
		if err != nil {
			return 0, fmt.Errorf("reading the postmaster's CPU time: %w", err)
		}
		live, err := s.children()
		if err != nil {
			return 0, err
		}
		after, err := readProcStat(s.postmaster)
		if err != nil {
			return 0, fmt.Errorf("reading the postmaster's CPU time: %w", err)
		}
		if after.cutime+after.cstime != before.cutime+before.cstime {
			continue
		}
		return time.Duration(after.utime+after.stime+after.cutime+after.cstime+live) * clockTick, nil
	}
	return 0, fmt.Errorf("the server's processes kept exiting while their CPU time was read")
}

// children sums the CPU time (ticks) of the postmaster's live children, their own and their
// reaped children's (an archive_command's, say).
func (s *serverCPU) children() (int64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.ppid != s.postmaster {
			continue // gone since the listing, or not the server's
		}
		ticks += st.utime + st.stime + st.cutime + st.cstime
	}
	return ticks, nil
}

type procStat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime int64
	starttime                    int64 // clock ticks after the boot
}

// bootTime is when this host booted (btime of /proc/stat).
func bootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("/proc/stat btime: %w", err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, fmt.Errorf("/proc/stat: no btime")
}

// readProcStat parses /proc/<pid>/stat (proc(5)): the command name in parentheses, then
// space-separated fields, ppid the 4th, utime to cstime the 14th to 17th, starttime the 22nd.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(pid, string(b))
}

func parseProcStat(pid int, s string) (procStat, error) {
	// The name may hold spaces and parentheses: it ends at the last ')'.
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	st := procStat{comm: s[open+1 : end]}
	nums := make([]int64, 6)
	for i, field := range []int{4, 14, 15, 16, 17, 22} {
		var err error
		if nums[i], err = strconv.ParseInt(f[field-3], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("/proc/%d/stat field %d: %w", pid, field, err)
		}
	}
	st.ppid = int(nums[0])
	st.utime, st.stime, st.cutime, st.cstime, st.starttime = nums[1], nums[2], nums[3], nums[4], nums[5]
	return st, nil
}

// dbCPUMeter measures the server's CPU time over one measurement. Its zero value, and one
// started where the server's CPU cannot be read, reports unknown (-1).
type dbCPUMeter struct {
	s     *serverCPU
	start time.Duration
}

// dbCPU starts measuring the server's CPU time.
func (r *runner) dbCPU() dbCPUMeter { return r.serverCPU.meter() }

// meter starts measuring the server's CPU time; on a nil s it measures nothing.
func (s *serverCPU) meter() dbCPUMeter {
	if s == nil {
		return dbCPUMeter{}
	}
	t, err := s.total()
	if err != nil {
		return dbCPUMeter{}
	}
	return dbCPUMeter{s: s, start: t}
}

// used is the server's CPU time since the meter started, or -1 when it cannot be read.
func (m dbCPUMeter) used() time.Duration {
	if m.s == nil {
		return -1
	}
	t, err := m.s.total()
	if err != nil {
		return -1
	}
	return t - m.start
}

// fmtCores is CPU time over a wall time, in cores ("0.93"), or "-" when unknown (negative).
func fmtCores(cpu, wall time.Duration) string {
	if cpu < 0 || wall <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", cpu.Seconds()/wall.Seconds())
}

// fmtPerCore is items per second of CPU time ("per database core"), or "-" when unknown
// (negative) or no items were measured. CPU time is counted in clock ticks: under one tick, it is at least items per
// tick.
func fmtPerCore(items int, cpu time.Duration) string {
	switch {
	case cpu < 0 || items <= 0:
		return "-"
	case cpu == 0:
		return ">" + fmtRate(float64(items)/clockTick.Seconds())
	}
	return fmtRate(float64(items) / cpu.Seconds())
}

// fmtCPUPer is CPU time per item, or "-" when unknown (negative); under one tick, "<" the
// tick's share.
func fmtCPUPer(cpu time.Duration, items int) string {
	switch {
	case cpu < 0 || items <= 0:
		return "-"
	case cpu == 0:
		return "<" + fmtDur(clockTick/time.Duration(items))
	}
	return fmtDur(cpu / time.Duration(items))
}

// cpuPerItem is the median over ms of the CPU time cpu reports per item, in seconds, and of
// the cores it kept busy (CPU time over wall time); ok is false when no run measured it
// (cpu reports it not measured).
func cpuPerItem(ms []measurement, cpu func(measurement) (time.Duration, bool)) (per, cores float64, ok bool) {
	var pers, coress []float64
	for _, m := range ms {
		if c, measured := cpu(m); measured && m.items > 0 && m.elapsed > 0 {
			pers = append(pers, c.Seconds()/float64(m.items))
			coress = append(coress, c.Seconds()/m.elapsed.Seconds())
		}
	}
	if len(pers) == 0 {
		return 0, 0, false
	}
	return median(pers), median(coress), true
}

// machineCost is the CPU time per item of the database and this process together, for two
// variants run in the same rounds (a[i] and b[i] met the same round): each one's median in
// seconds, and the median of the rounds' ratios a/b. Rounds where either variant's database
// CPU was not measured are left out; ok is false when none is left.
//
// Where the two processes keep the machine's cores busy (8 runs at once), a variant's rate is
// the cores over this cost, so a/b is the b/a rate ratio the work allows. It tells work from
// waiting: a rate ratio well below it was lost to locks, pickup or a slow shard's tail, not to
// what Stepwise computes or sends.
func machineCost(a, b []measurement) (aCost, bCost, ratio float64, ok bool) {
	var as, bs, ratios []float64
	for i := range min(len(a), len(b)) {
		ca, cb := itemCost(a[i]), itemCost(b[i])
		if ca <= 0 || cb <= 0 {
			continue
		}
		as, bs, ratios = append(as, ca), append(bs, cb), append(ratios, ca/cb)
	}
	if len(ratios) == 0 {
		return 0, 0, 0, false
	}
	return median(as), median(bs), median(ratios), true
}

// itemCost is m's CPU time per item of the database and this process, in seconds, or 0 where
// either was not measured.
func itemCost(m measurement) float64 {
	if m.db < 0 || m.proc <= 0 || m.items <= 0 {
		return 0
	}
	return (m.db + m.proc).Seconds() / float64(m.items)
}

// dbCPULine is the database's CPU time per item over the measured runs (the median), the
// items per second of it, and the cores it kept busy (the median of CPU time over wall
// time), or "-" when it was not measured.
func dbCPULine(ms []measurement, unit string) string {
	p, cores, ok := cpuPerItem(ms, func(m measurement) (time.Duration, bool) { return m.db, m.db >= 0 })
	switch {
	case !ok:
		return "-"
	case p == 0:
		return fmt.Sprintf("under one clock tick (%s) in all, %.2f cores", clockTick, cores)
	}
	return fmt.Sprintf("%s a %s, %s per db core, %.2f cores", fmtDur(time.Duration(p*float64(time.Second))), unit, fmtRate(1/p), cores)
}

// procCPULine is this process's CPU time per item over the measured runs (the median) and
// the cores it kept busy, or "-" when it was not measured.
func procCPULine(ms []measurement, unit string) string {
	p, cores, ok := cpuPerItem(ms, func(m measurement) (time.Duration, bool) { return m.proc, m.proc > 0 })
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%s a %s, %.2f cores", fmtDur(time.Duration(p*float64(time.Second))), unit, cores)
}
