package bench

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	// A name with a space and a ')' of its own: the fields start after the last ')'.
	st, err := parseProcStat(7, "7 (a b) c) S 1 7 7 0 -1 4194560 100 0 0 0 12 34 56 78 20 0 1 0 99 0 0")
	require.NoError(t, err)
	require.Equal(t, procStat{comm: "a b) c", ppid: 1, utime: 12, stime: 34, cutime: 56, cstime: 78, starttime: 99}, st)
	_, err = parseProcStat(7, "7 (x) S 1 2")
	require.ErrorContains(t, err, "fields")

	// This process, read from /proc: its parent, and its CPU time in the unit clockTick
	// assumes (USER_HZ), against getrusage's.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
	}
	self, err := readProcStat(os.Getpid())
	require.NoError(t, err)
	require.Equal(t, os.Getppid(), self.ppid)
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	rusage := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	proc := time.Duration(self.utime+self.stime) * clockTick
	require.InDelta(t, rusage.Seconds(), proc.Seconds(), 0.1+0.1*rusage.Seconds(), "/proc's CPU time %s, getrusage's %s: is USER_HZ 100?", proc, rusage)
}

// The server's CPU time counts a backend that used CPU and exited between two readings: its
// time moves from the live children into the postmaster's reaped children's time, and a
// reading of the live backends alone would lose it.
func TestServerCPUCountsExitedBackends(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	s, why := findServerCPU(ctx, pool)
	if s == nil {
		t.Skipf("the test server's CPU cannot be read from this host: %s", why)
	}
	m := s.meter()
	conn, err := pgx.Connect(ctx, testkit.DBURL(t))
	require.NoError(t, err)
	var pid int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = conn.Exec(ctx, `SELECT sum(i) FROM generate_series(1, 5000000) i`)
	require.NoError(t, err)
	st, err := readProcStat(pid)
	require.NoError(t, err)
	own := time.Duration(st.utime+st.stime) * clockTick
	require.GreaterOrEqual(t, own, 100*time.Millisecond, "the backend's CPU time for 5M rows")
	before, err := s.total()
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	// Wait for the backend to exit and the postmaster to reap it.
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
		return errors.Is(err, fs.ErrNotExist)
	}, 10*time.Second, 10*time.Millisecond, "backend %d still there", pid)
	after, err := s.total()
	require.NoError(t, err)
	used := m.used()
	// Across the exit the total must not fall by the backend's time (other backends of a
	// busy test server only add to it, so this holds whatever else runs).
	require.GreaterOrEqual(t, after, before, "the server's CPU time fell across the exit of a backend that used %s", own)
	require.GreaterOrEqual(t, used, own, "the server's CPU since the meter started, against the exited backend's own")
	require.Equal(t, "-", fmtCores(dbCPUMeter{}.used(), time.Second), "a meter that measured nothing reads as not measured")
}
