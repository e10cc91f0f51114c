package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/workflowtest"
)

func TestMain(m *testing.M) {
	if handled, code := workflowtest.RunRoleIfChild(); handled {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func init() {
	// Starts a throwaway cluster and never closes it: the test kills this process.
	workflowtest.RegisterRole("start-cluster", func(ctx context.Context, env map[string]string) error {
		srv, err := Find(ctx, &Opts{SkipEnv: true, SkipLocal: true, tempDir: env["CLUSTER_BASE"]})
		if err != nil {
			return err
		}
		fmt.Println("cluster", strings.TrimPrefix(srv.Source, "throwaway:"))
		<-ctx.Done()
		return srv.Close()
	})
}

func TestFindEnvDeadPortNamesVariable(t *testing.T) {
	port, err := freePort() // nothing listens once freePort returns
	require.NoError(t, err)
	t.Setenv("STEPWISE_TEST_DEAD_URL", fmt.Sprintf("postgres://postgres:secret@127.0.0.1:%d/postgres", port))

	_, err = Find(context.Background(), &Opts{EnvVars: []string{"STEPWISE_TEST_DEAD_URL"}})
	require.Error(t, err)
	var envErr *EnvServerError
	require.ErrorAs(t, err, &envErr)
	require.Equal(t, "STEPWISE_TEST_DEAD_URL", envErr.Var)
	require.Contains(t, err.Error(), "$STEPWISE_TEST_DEAD_URL")
	require.Contains(t, err.Error(), fmt.Sprintf("127.0.0.1:%d", port))
	require.NotContains(t, err.Error(), "secret", "the error must not leak the URL's password")
}

func TestFindEnvFirstSetVariableWins(t *testing.T) {
	srv := requireLocal(t)
	t.Setenv("STEPWISE_TEST_UNSET_URL", "")
	t.Setenv("STEPWISE_TEST_URL", srv.URL)

	got, err := Find(context.Background(), &Opts{EnvVars: []string{"STEPWISE_TEST_UNSET_URL", "STEPWISE_TEST_URL"}})
	require.NoError(t, err)
	require.Equal(t, "env:STEPWISE_TEST_URL", got.Source)
	require.Equal(t, srv.URL, got.URL)
	require.True(t, got.Local())
	require.NoError(t, got.Close())
}

func TestFindLocal(t *testing.T) {
	srv := requireLocal(t)
	require.Equal(t, "local:127.0.0.1:5432", srv.Source)
	require.True(t, srv.Local())
	conn, err := pgx.Connect(context.Background(), srv.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var canCreate bool
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user").Scan(&canCreate))
	require.True(t, canCreate)
}

// TestThrowawayCluster forces the fallback for real: initdb, pg_ctl and postgres from this
// machine, run as nobody when the test runs as root.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var logs []string
	srv, err := Find(ctx, &Opts{SkipEnv: true, SkipLocal: true, Logf: func(f string, a ...any) {
		logs = append(logs, fmt.Sprintf(f, a...))
	}})
	if errors.Is(err, ErrNoServer) {
		t.Skipf("no PostgreSQL binaries on this machine: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	t.Log(strings.Join(logs, "\n"))

	dir := strings.TrimPrefix(srv.Source, "throwaway:")
	require.NotEqual(t, srv.Source, dir, "source %q", srv.Source)
	require.DirExists(t, dir)
	require.True(t, srv.Local())
	require.True(t, strings.HasPrefix(filepath.Base(dir), dirPrefix))

	if os.Geteuid() == 0 {
		fi, err := os.Stat(filepath.Join(dir, "data"))
		require.NoError(t, err)
		require.NotZero(t, fi.Sys().(*syscall.Stat_t).Uid, "the cluster must not run as root")
	}

	conn, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 1, n)
	for setting, want := range map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "200"} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got))
		require.Equal(t, want, got, setting)
	}
	require.NoError(t, conn.Close(ctx))

	postmaster := postmasterPid(t, dir)
	require.NoError(t, srv.Close())
	require.NoDirExists(t, dir)
	require.True(t, gone(postmaster), "postmaster %d still running after Close", postmaster)
	require.NoError(t, srv.Close(), "a second Close is a no-op")
}

// TestSweepStaleClusters leaves a cluster behind as a test process killed with kill -9
// would (a real child process starts it and is SIGKILLed alone, so its postmaster keeps
// running), and checks that the next cluster start stops and removes it, removes an old
// directory without an owner file, and leaves alone a fresh one, which may be mid-setup.
func TestSweepStaleClusters(t *testing.T) {
	t.Parallel()
	if _, err := findBinDir(); err != nil {
		t.Skipf("no PostgreSQL binaries on this machine: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := sharedTempDir(t)

	owner := workflowtest.Start(t, "start-cluster", "CLUSTER_BASE="+base)
	line, err := owner.WaitForLine(ctx, "cluster ")
	require.NoError(t, err)
	leftDir := strings.TrimPrefix(line, "cluster ")
	leftPostmaster := postmasterPid(t, leftDir)
	require.NoError(t, owner.Signal(syscall.SIGKILL)) // the owner only, not its group
	require.Error(t, owner.Wait())
	require.True(t, processAlive(leftPostmaster), "the postmaster outlives its owner; that is what sweeping is for")

	settingUp := filepath.Join(base, dirPrefix+"settingup")
	require.NoError(t, os.Mkdir(settingUp, 0o700))
	abandoned := filepath.Join(base, dirPrefix+"abandoned")
	require.NoError(t, os.Mkdir(abandoned, 0o700))
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(abandoned, old, old))

	var logs []string
	next, err := Find(ctx, &Opts{SkipEnv: true, SkipLocal: true, tempDir: base, Logf: func(f string, a ...any) {
		logs = append(logs, fmt.Sprintf(f, a...))
	}})
	require.NoError(t, err)
	t.Cleanup(func() { next.Close() })

	require.NoDirExists(t, leftDir)
	require.True(t, gone(leftPostmaster), "stale postmaster %d still running", leftPostmaster)
	require.NoDirExists(t, abandoned)
	require.DirExists(t, settingUp, "a fresh directory without owner.pid may be mid-setup")
	require.Contains(t, strings.Join(logs, "\n"), "removed stale throwaway cluster "+leftDir)
	require.NoError(t, next.Close())
}

func TestVersionOf(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]float64{
		"/usr/lib/postgresql/16/bin":            16,
		"/usr/lib/postgresql/9.6/bin":           9.6,
		"/usr/pgsql-15/bin":                     15,
		"/opt/homebrew/opt/postgresql@17/bin":   17,
		"/usr/local/pgsql/bin":                  0,
		"/usr/local/opt/postgresql@14/bin/more": 14,
	} {
		require.Equal(t, want, versionOf(path), path)
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "/var/run/postgresql": true, "": true,
		"db.internal": false, "10.0.0.5": false,
	} {
		require.Equal(t, want, isLoopback(host), host)
	}
}

// requireLocal returns the server on 127.0.0.1:5432, skipping when there is none or the
// fallback is being exercised on purpose.
func requireLocal(t *testing.T) *Server {
	t.Helper()
	if os.Getenv(SkipLocalEnv) == "1" {
		t.Skipf("%s=1", SkipLocalEnv)
	}
	srv, err := fromLocal(context.Background())
	if err != nil {
		t.Skipf("no usable server on %s: %v", localAddr, err)
	}
	return srv
}

// sharedTempDir is a directory the cluster's unprivileged user can enter (t.TempDir's
// parents are private to root).
func sharedTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "stepwise-pgserver-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func postmasterPid(t *testing.T, dir string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	require.NoError(t, err)
	return pid
}

// gone reports whether pid has exited, waiting up to a few seconds for it to do so. A
// zombie (exited, not yet reaped by its new parent) counts as gone.
func gone(pid int) bool {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if !processAlive(pid) {
			return true
		}
		if runtime.GOOS == "linux" {
			if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
				if _, after, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(after, "Z") {
					return true
				}
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHalfWrittenOwnerIsNotStale: a sweeper that reads a cluster's owner file while its
// owner is writing it must not remove the cluster; CI once lost a cluster that way.
func TestHalfWrittenOwnerIsNotStale(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	for name, content := range map[string]string{"empty": "", "garbled": "12ab"} {
		dir := filepath.Join(base, dirPrefix+name)
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, ownerFile), []byte(content), 0o644))
		require.False(t, isStale(dir), "%s owner file in a fresh directory", name)
		old := time.Now().Add(-2 * time.Hour)
		require.NoError(t, os.Chtimes(dir, old, old))
		require.True(t, isStale(dir), "%s owner file in a directory untouched for 2 hours", name)
	}
	dir := filepath.Join(base, dirPrefix+"written")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, writeOwner(dir))
	require.False(t, isStale(dir), "this process owns it")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only %s is left", ownerFile)
}
