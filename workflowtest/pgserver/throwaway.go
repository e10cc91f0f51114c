package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// dirPrefix names throwaway cluster directories, so a later Find can recognise and sweep the
// ones whose owner died.
const dirPrefix = "stepwise-pg-"

// ownerFile holds the pid of the process that started the cluster.
const ownerFile = "owner.pid"

// binDirGlobs are searched, after PATH, for initdb, pg_ctl and postgres; the newest major
// version wins where a glob matches several.
var binDirGlobs = []string{
	"/usr/lib/postgresql/*/bin",          // Debian, Ubuntu
	"/usr/pgsql-*/bin",                   // RHEL, Fedora (PGDG)
	"/usr/local/pgsql/bin",               // built from source
	"/opt/homebrew/opt/postgresql@*/bin", // Homebrew, Apple silicon
	"/usr/local/opt/postgresql@*/bin",    // Homebrew, Intel
	"/opt/homebrew/bin",
	"/usr/local/bin",
}

// unprivilegedUsers are tried, in order, to run a throwaway cluster when this process is
// root: initdb and postgres refuse to run as root.
var unprivilegedUsers = []string{"nobody", "postgres"}

var errNoBinaries = errors.New("no PostgreSQL binaries found")

// cluster is a throwaway PostgreSQL data directory and the server running on it.
type cluster struct {
	dir  string // stepwise-pg-*; holds owner.pid, data/, the socket and the log
	bin  string // directory of initdb, pg_ctl, postgres
	cred *syscall.Credential
	as   string // user name the cluster runs as
	port int
	logf func(string, ...any)
	// durableCommits keeps synchronous_commit on (see Throwaway).
	durableCommits bool
}

func (c *cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

func startThrowaway(ctx context.Context, opts *Opts) (*Server, error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, as, err := runAsCredential()
	if err != nil {
		return nil, err
	}
	base := opts.tempDir
	if base == "" {
		if base, err = baseDir(cred); err != nil {
			return nil, err
		}
	}
	if opts.tempDir != "" {
		sweepStale(ctx, base, bin, opts.Logf)
	} else {
		for _, dir := range sweepDirs(base) {
			sweepStale(ctx, dir, bin, opts.Logf)
		}
	}

	started := time.Now()
	dir, err := os.MkdirTemp(base, dirPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("creating throwaway cluster directory: %w", err)
	}
	c := &cluster{dir: dir, bin: bin, cred: cred, as: as, logf: opts.Logf, durableCommits: opts.durableCommits}
	// The owner pid goes in before anything slow, so a sweeper in another process never
	// mistakes a cluster being set up for one left behind.
	if err := writeOwner(dir); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("writing %s: %w", ownerFile, err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("handing %s to user %s: %w", dir, as, err)
		}
	}
	if err := c.start(ctx); err != nil {
		c.stop() //nolint:errcheck // reporting the start failure matters more
		return nil, err
	}
	u := (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	cfg, err := pgx.ParseConfig(u)
	if err == nil {
		err = ping(ctx, cfg)
	}
	if err != nil {
		c.stop() //nolint:errcheck
		return nil, fmt.Errorf("connecting to throwaway cluster in %s: %w", dir, err)
	}
	opts.Logf("pgserver: started throwaway PostgreSQL in %s on 127.0.0.1:%d as %s (%s from %s)",
		dir, c.port, c.as, time.Since(started).Round(time.Millisecond), bin)
	return &Server{URL: u, Source: "throwaway:" + dir, local: true, cluster: c}, nil
}

func (c *cluster) start(ctx context.Context) error {
	if out, err := c.run(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("initdb in %s as %s: %w\n%s", c.dir, c.as, err, out)
	}
	// Durability is off: the cluster is thrown away, and tests should not wait for fsync.
	conf := fmt.Sprintf(`
# added by stepwise pgserver: throwaway cluster for tests
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
fsync = off
synchronous_commit = %s
full_page_writes = off
max_connections = 200
shared_buffers = 64MB
max_wal_size = 256MB
`, strings.ReplaceAll(c.dir, "'", "''"), map[bool]string{false: "off", true: "on"}[c.durableCommits])
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening postgresql.conf: %w", err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing postgresql.conf: %w", err)
	}

	return c.serve(ctx, 0)
}

// serve starts the server on the cluster's data directory, on port, or on a free port when
// port is 0.
func (c *cluster) serve(ctx context.Context, port int) error {
	// A free port found by listening and closing can be taken by someone else before the
	// server binds it; try a few.
	var lastErr error
	for range 5 {
		p := port
		if p == 0 {
			var err error
			if p, err = freePort(); err != nil {
				return err
			}
		}
		out, err := c.run(ctx, "pg_ctl", "start", "-D", c.dataDir(), "-l", c.logFile(), "-w", "-t", "60",
			"-o", "-p "+strconv.Itoa(p))
		if err == nil {
			c.port = p
			return nil
		}
		logTail := tail(c.logFile(), 20)
		lastErr = fmt.Errorf("pg_ctl start as %s: %w\n%s\n%s", c.as, err, out, logTail)
		if port != 0 || !strings.Contains(logTail, "could not bind") && !strings.Contains(logTail, "already in use") {
			return lastErr
		}
	}
	return lastErr
}

// stop shuts the server down (fast, then immediate) and removes the directory.
func (c *cluster) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stopErr error
	if _, err := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil {
		if out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir(), "-m", "fast", "-w", "-t", "10"); err != nil {
			if out2, err2 := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir(), "-m", "immediate", "-w", "-t", "10"); err2 != nil {
				stopErr = fmt.Errorf("stopping throwaway cluster in %s: %w\n%s\n%s", c.dir, err2, out, out2)
			}
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return errors.Join(stopErr, fmt.Errorf("removing %s: %w", c.dir, err))
	}
	return stopErr
}

// run runs one of the PostgreSQL binaries as the cluster's user.
func (c *cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return runPG(ctx, c.bin, c.dir, c.cred, name, args...)
}

func runPG(ctx context.Context, bin, dir string, cred *syscall.Credential, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	// The working directory must be readable by the cluster's user (pg_ctl and initdb
	// resolve it), which this process's own may not be.
	cmd.Dir = dir
	cmd.Env = pgEnv()
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	// pg_ctl start leaves the postmaster running; should it ever hold our pipe open, do not
	// wait for it forever.
	cmd.WaitDelay = 5 * time.Second
	return cmd.CombinedOutput()
}

// pgEnv is this process's environment without PG* variables, which would otherwise point
// initdb and pg_ctl at another server or data directory.
func pgEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// findBinDir returns a directory holding initdb, pg_ctl and postgres: PATH first, then the
// usual install directories, newest major version first.
func findBinDir() (string, error) {
	has := func(dir string) bool {
		for _, n := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	for _, g := range binDirGlobs {
		matches, _ := filepath.Glob(g)
		sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
		for _, m := range matches {
			if has(m) {
				return m, nil
			}
		}
	}
	return "", errNoBinaries
}

// versionOf extracts the major version from a path like /usr/lib/postgresql/16/bin or
// /opt/homebrew/opt/postgresql@16/bin (0 when there is none).
func versionOf(path string) float64 {
	for _, part := range strings.Split(path, string(filepath.Separator)) {
		if _, after, ok := strings.Cut(part, "@"); ok {
			part = after
		}
		if v, err := strconv.ParseFloat(strings.TrimPrefix(part, "pgsql-"), 64); err == nil {
			return v
		}
	}
	return 0
}

// runAsCredential returns the credential to run PostgreSQL under: nil when this process is
// not root, else an existing unprivileged account.
func runAsCredential() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		name := os.Getenv("USER")
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return nil, name, nil
	}
	for _, name := range unprivilegedUsers {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, name, nil
	}
	return nil, "", fmt.Errorf("running as root and none of the users %s exists; initdb refuses root: run the tests as another user or set DATABASE_URL",
		strings.Join(unprivilegedUsers, ", "))
}

// baseDir is the directory throwaway clusters live in. On Linux, /dev/shm when it is a
// tmpfs with room to spare: on a disk, CREATE DATABASE (a per-test database) costs
// 150–300 ms in file creation alone, on tmpfs under 20 ms. Else the temp dir, or /tmp when
// the cluster's user could not reach the temp dir (e.g. TMPDIR under /root).
func baseDir(cred *syscall.Credential) (string, error) {
	if onTmpfs(shmDir) {
		return shmDir, nil
	}
	base := os.TempDir()
	if cred == nil || traversableByOthers(base) {
		return base, nil
	}
	if traversableByOthers("/tmp") {
		return "/tmp", nil
	}
	return "", fmt.Errorf("neither %s nor /tmp can be reached by user %d, which the throwaway cluster runs as; set TMPDIR to a directory every user can enter", base, cred.Uid)
}

// shmDir is Linux's memory-backed tmpfs.
const shmDir = "/dev/shm"

// minTmpfsFree is the free space /dev/shm must have to hold a cluster (data and WAL live in
// memory there); containers often mount a 64 MB /dev/shm, which would not do.
const minTmpfsFree = 2 << 30

func onTmpfs(dir string) bool {
	if runtime.GOOS != "linux" {
		return false
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false
	}
	const tmpfsMagic = 0x01021994
	return int64(st.Type) == tmpfsMagic &&
		uint64(st.Bavail)*uint64(st.Bsize) >= minTmpfsFree &&
		traversableByOthers(dir) && syscall.Access(dir, 2 /* W_OK */) == nil
}

// sweepDirs are the directories a throwaway cluster may have been left in.
func sweepDirs(base string) []string {
	dirs := []string{base}
	for _, d := range []string{shmDir, os.TempDir(), "/tmp"} {
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func traversableByOthers(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// sweepStale stops and removes cluster directories whose owner process is dead (killed with
// kill -9, or by a test timeout), so they do not pile up. A directory without an owner file
// is only swept once it is old: its owner may be writing the file right now.
func sweepStale(ctx context.Context, base, bin string, logf func(string, ...any)) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if !isStale(dir) {
			continue
		}
		stopStale(ctx, dir, bin)
		if err := os.RemoveAll(dir); err != nil {
			logf("pgserver: removing stale cluster %s: %v", dir, err)
			continue
		}
		logf("pgserver: removed stale throwaway cluster %s (its owner process is gone)", dir)
	}
}

// writeOwner records this process as the cluster's owner. The pid is written to a side
// file and renamed into place, so a sweeper in another process reads either no owner file
// or a whole one: os.WriteFile truncates first, and a sweeper that read the empty file
// between truncate and write once took a cluster being set up for one left behind and
// removed it under its owner (CI: "chown …: no such file or directory").
func writeOwner(dir string) error {
	tmp := filepath.Join(dir, ownerFile+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, ownerFile))
}

func isStale(dir string) bool {
	raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || perr != nil || pid <= 0 {
		// No owner yet, or one we cannot read: its owner may be setting it up right now,
		// so only a directory left untouched for a minute counts as abandoned.
		fi, err := os.Stat(dir)
		return err == nil && time.Since(fi.ModTime()) > time.Minute
	}
	return !processAlive(pid)
}

// stopStale stops a left-behind postmaster, as the directory's owner. Should that fail,
// removing the directory still ends it: PostgreSQL shuts itself down within about a minute
// once its data directory's lock file is gone.
func stopStale(ctx context.Context, dir, bin string) {
	data := filepath.Join(dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err != nil {
		return
	}
	var cred *syscall.Credential
	if fi, err := os.Stat(data); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 && st.Uid != 0 {
			cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	runPG(ctx, bin, dir, cred, "pg_ctl", "stop", "-D", data, "-m", "immediate", "-w", "-t", "10") //nolint:errcheck // see above
}

// processAlive reports whether pid exists. EPERM means it exists but belongs to someone
// else, which still counts as alive.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string, n int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(raw, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
