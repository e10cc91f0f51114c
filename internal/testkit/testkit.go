package testkit

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"go.uber.org/goleak"

	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/pgserver"
)

const (
	// testDBPrefix starts the name of every per-test database; the pid and host tag that
	// follow let a later process drop the ones a killed process left behind.
	testDBPrefix = "stepwise_test_"
	// templatePrefix starts template names; the hash that follows changes with any
	// migration, so a changed migration never clones a stale schema.
	templatePrefix = "stepwise_tpl_"
	maxNameLen     = 20 // for TemplateDB names: keeps every identifier under Postgres's 63 bytes
)

var templateNameRE = regexp.MustCompile(`^[a-z0-9_]{1,20}$`)

var (
	mainRunning atomic.Bool

	serverOnce sync.Once
	server     *pgserver.Server
	admin      *pgxpool.Pool
	serverErr  error

	templatesMu sync.Mutex
	templates   = map[string]*templateEntry{}

	dbSeq atomic.Int64
)

type templateEntry struct {
	once  sync.Once
	ready chan struct{} // closed when once has run
	name  string
	err   error
}

func (e *templateEntry) done() bool {
	select {
	case <-e.ready:
		return true
	default:
		return false
	}
}

// Main runs the tests of a package. Use it as the package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }
//
// In a child started by workflowtest.Start it runs the child's role instead of the tests.
// Otherwise it runs the tests, then closes the connection to the server and stops a
// throwaway cluster if this process started one, then fails the run if goroutines started
// during the tests are still running (goleak).
func Main(m *testing.M) int {
	if handled, code := workflowtest.RunRoleIfChild(); handled {
		return code
	}
	cancelNote := noteBeforePackageTimeout()
	// Goroutines that exist before any test ran (started by package init functions) are
	// not the tests' leaks.
	preexisting := goleak.IgnoreCurrent()
	mainRunning.Store(true)
	code := m.Run()
	mainRunning.Store(false)
	cancelNote()

	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "testkit: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(preexisting); err != nil {
			fmt.Fprintf(os.Stderr, "testkit: goroutines still running after the tests (close pools, stop clients, cancel contexts):\n%v\n", err)
			code = 1
		}
	}
	return code
}

// timeoutNoteLead is how long before the package's -timeout Main says whether the tests were
// still moving.
const timeoutNoteLead = 30 * time.Second

// noteBeforePackageTimeout arranges that, timeoutNoteLead before this package's -timeout ends
// it, stderr says whether its tests were still making progress (a WaitProgress moved within
// StallTimeoutDefault) or had stopped, and returns a function that cancels the note.
//
// Guards against: a slow-but-moving package read as a hung one. go test's -timeout (10m when
// not given) is a wall-clock bound enforced twice: by the test binary (a panic listing the
// running tests) and, a minute later, by go test itself, which sends the binary SIGQUIT ("Test
// killed with quit: ran too long (11m0s)"). No test binary can extend the second: an earlier
// Main raised its own -test.timeout to 40m, so go test's SIGQUIT, a bare goroutine dump with
// no verdict, ended the chaos and sample packages at 661 s of a run at load 30-53 whose tests
// were still moving. The bound is go test's flag (-timeout 40m where machines are loaded, as
// in CI); what a test can do is say, when the bound strikes, whether that was time or a stall.
func noteBeforePackageTimeout() (cancel func()) {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() {}
	}
	d, err := time.ParseDuration(f.Value.String())
	if err != nil || d <= 2*timeoutNoteLead {
		return func() {}
	}
	timer := time.AfterFunc(d-timeoutNoteLead, func() {
		fmt.Fprintln(os.Stderr, timeoutVerdict(d, time.Now()))
	})
	return func() { timer.Stop() }
}

// timeoutVerdict is the note noteBeforePackageTimeout prints at now.
func timeoutVerdict(timeout time.Duration, now time.Time) string {
	what, at := lastProgress()
	switch {
	case at.IsZero():
		return fmt.Sprintf("testkit: go test's -timeout %s ends this package in %s; no WaitProgress has run, so whether the tests still move is unknown: "+
			"if the goroutine dump that follows shows them working, rerun with a larger -timeout (e.g. -timeout 40m)", timeout, timeoutNoteLead)
	case now.Sub(at) <= StallTimeoutDefault:
		return fmt.Sprintf("testkit: go test's -timeout %s ends this package in %s while its tests still make progress (%q moved %s ago): "+
			"that is time, not a bug; rerun with a larger -timeout (e.g. -timeout 40m; go test kills a package one minute after -timeout, which no test can extend)",
			timeout, timeoutNoteLead, what, now.Sub(at).Round(time.Second))
	default:
		return fmt.Sprintf("testkit: go test's -timeout %s ends this package in %s, and no WaitProgress has moved for %s (last: %q): "+
			"a stall; the goroutine dump that follows shows where", timeout, timeoutNoteLead, now.Sub(at).Round(time.Second), what)
	}
}

func shutdown() error {
	if admin != nil {
		admin.Close()
	}
	if server != nil {
		if err := server.Close(); err != nil {
			return fmt.Errorf("closing %s: %w", server.Source, err)
		}
	}
	return nil
}

// DB returns a pool on a fresh database of its own, cloned from a template migrated with
// migrations.Migrate. The pool is closed and the database dropped at t's cleanup.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return poolFor(t, DBURL(t))
}

// DBURL is DB's URL twin, for code that opens its own connections, such as a child process
// started with workflowtest.Start. The database is dropped at t's cleanup, even while
// something is still connected to it.
func DBURL(t testing.TB) string {
	t.Helper()
	return TemplateDBURL(t, "", nil)
}

// TemplateDB is DB with the template additionally prepared by setup (business tables of
// the sample service, for instance). setup runs once per template, not per test; name goes
// into the template's name, so change name whenever setup changes, or tests will go on
// cloning the old template. name is 1–20 characters of [a-z0-9_].
func TemplateDB(t testing.TB, name string, setup func(ctx context.Context, pool *pgxpool.Pool) error) *pgxpool.Pool {
	t.Helper()
	return poolFor(t, TemplateDBURL(t, name, setup))
}

// TemplateDBURL is TemplateDB's URL twin.
func TemplateDBURL(t testing.TB, name string, setup func(ctx context.Context, pool *pgxpool.Pool) error) string {
	t.Helper()
	if name != "" && !templateNameRE.MatchString(name) {
		t.Fatalf("testkit.TemplateDB: name %q must be 1-%d characters of [a-z0-9_]", name, maxNameLen)
	}
	if name != "" && setup == nil {
		t.Fatalf("testkit.TemplateDB(%q): setup is nil; use testkit.DB for the plain migrated template", name)
	}
	srv := requireServer(t)
	tpl, err := template(name, setup, false)
	if err != nil {
		t.Fatalf("testkit: preparing template database: %v", err)
	}
	return clone(t, srv, templateRef{name: tpl, rebuild: func() (string, error) { return template(name, setup, true) }})
}

// EmptyDB returns a pool on a fresh database with no schema at all, made the way a user
// makes one: a plain CREATE DATABASE, no template of ours. For tests of migrations and of
// what every command does on a database nobody migrated.
func EmptyDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return poolFor(t, EmptyDBURL(t))
}

// EmptyDBURL is EmptyDB's URL twin.
func EmptyDBURL(t testing.TB) string {
	t.Helper()
	return clone(t, requireServer(t), templateRef{}) // no name: a plain CREATE DATABASE
}

func poolFor(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("testkit: opening pool: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the drop registered by clone (cleanups run last-in first-out)
	return pool
}

func requireServer(t testing.TB) *pgserver.Server {
	t.Helper()
	if !mainRunning.Load() {
		t.Fatalf("testkit: add func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) } to this package: " +
			"Main stops a throwaway PostgreSQL started for the tests and runs child roles of workflowtest.Start")
	}
	serverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		server, serverErr = pgserver.Find(ctx, &pgserver.Opts{
			EnvVars: []string{"TEST_DATABASE_URL", "DATABASE_URL"},
			Logf:    func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
		})
		if serverErr != nil {
			return
		}
		cfg, err := pgxpool.ParseConfig(server.URL)
		if err != nil {
			serverErr = fmt.Errorf("parsing server URL: %w", err)
			return
		}
		cfg.MaxConns = 8
		if admin, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			serverErr = fmt.Errorf("connecting to %s: %w", server.Source, err)
			return
		}
		if server.Local() {
			if err := sweepLeaked(ctx, true); err != nil {
				fmt.Fprintf(os.Stderr, "testkit: sweeping databases of killed test processes: %v\n", err)
			}
		}
	})
	if serverErr != nil {
		t.Fatalf("testkit: %v", serverErr)
	}
	return server
}

// templateRef names the template to clone, and how to build it again if it vanished.
type templateRef struct {
	name    string
	rebuild func() (string, error)
}

// clone creates a fresh database from tpl and drops it at t's cleanup.
func clone(t testing.TB, srv *pgserver.Server, tpl templateRef) string {
	t.Helper()
	name := fmt.Sprintf("%s%d_%s_%d", testDBPrefix, os.Getpid(), hostTag(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := createFromTemplate(ctx, name, tpl.name)
	if isMissingDB(err) && tpl.rebuild != nil {
		// Another process dropped the template as outdated (see dropOutdatedTemplates):
		// build it again rather than fail the test.
		var rebuilt string
		if rebuilt, err = tpl.rebuild(); err == nil {
			err = createFromTemplate(ctx, name, rebuilt)
		}
	}
	if err != nil {
		t.Fatalf("testkit: creating database %s from %s on %s: %v", name, tpl.name, srv.Source, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// FORCE: a River client or a child process the test forgot may still be connected.
		// IF EXISTS: the test may have dropped it itself.
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			t.Errorf("testkit: dropping database %s: %v", name, err)
		}
	})
	return withDatabase(srv.URL, name)
}

// createFromTemplate clones tpl. CREATE DATABASE fails while anyone is connected to the
// template ("source database is being accessed by other users"), e.g. a template being
// published by another process; that passes, so retry.
// An empty tpl is a plain CREATE DATABASE (the server's default template, as a user's).
func createFromTemplate(ctx context.Context, name, tpl string) error {
	backoff := 10 * time.Millisecond
	sql := "CREATE DATABASE " + ident(name)
	if tpl != "" {
		sql += " TEMPLATE " + ident(tpl)
	}
	for {
		_, err := admin.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// template returns the name of a ready template, building it on first use (or again, with
// rebuild, after it was found missing).
func template(name string, setup func(context.Context, *pgxpool.Pool) error, rebuild bool) (string, error) {
	hash, err := schemaHash()
	if err != nil {
		return "", err
	}
	tpl := templatePrefix + hash
	if name != "" {
		tpl = templatePrefix + name + "_" + hash
	}
	templatesMu.Lock()
	e, ok := templates[tpl]
	if !ok || rebuild && e.done() {
		e = &templateEntry{name: tpl, ready: make(chan struct{})}
		templates[tpl] = e
	}
	templatesMu.Unlock()
	e.once.Do(func() {
		defer close(e.ready)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		e.err = buildTemplate(ctx, tpl, setup)
	})
	return e.name, e.err
}

// buildTemplate creates tpl unless it exists. Many test binaries run at once under
// go test ./..., each its own process, so the build holds an advisory lock (taken in the
// admin database, which every process of this run shares). The template is built under a
// temporary name and renamed when complete, so no process can ever clone a half-migrated
// template, even one that does not honour the lock.
func buildTemplate(ctx context.Context, tpl string, setup func(context.Context, *pgxpool.Pool) error) error {
	conn, unlock, err := serverLock(ctx, "template "+tpl)
	if err != nil {
		return fmt.Errorf("taking the template lock: %w", err)
	}
	defer unlock()

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", tpl).Scan(&exists); err != nil {
		return fmt.Errorf("looking for template %s: %w", tpl, err)
	}
	if exists {
		return nil
	}

	// Under the lock nobody else builds this template, so any build database of it is
	// left over from a process killed mid-build.
	build := tpl + "_b"
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(build)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping leftover %s: %w", build, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(build)+" TEMPLATE template0"); err != nil {
		return fmt.Errorf("creating %s: %w", build, err)
	}
	if err := prepare(ctx, withDatabase(server.URL, build), setup); err != nil {
		return fmt.Errorf("preparing template %s: %w", tpl, err)
	}
	// No connections from now on: a session left on a template makes every clone fail.
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(build)+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("closing %s to connections: %w", build, err)
	}
	for {
		// Backends of the closed pool may take a moment to exit; rename needs them gone.
		_, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", build)
		if err == nil {
			_, err = conn.Exec(ctx, "ALTER DATABASE "+ident(build)+" RENAME TO "+ident(tpl))
		}
		var pgErr *pgconn.PgError
		if err == nil {
			dropOutdatedTemplates(ctx, conn, tpl, outdatedTemplateAge)
			return nil
		}
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			return fmt.Errorf("publishing template %s: %w", tpl, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publishing template %s: %w", tpl, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// templateNameParts matches stepwise_tpl_[<name>_]<hash>.
var templateNameParts = regexp.MustCompile(`^` + templatePrefix + `(?:(.+)_)?([0-9a-f]{12})$`)

// outdatedTemplateAge is how long a template of other migrations is kept after it was
// created: a checkout on another branch may still be cloning it (and rebuilds it if not).
const outdatedTemplateAge = time.Hour

// dropOutdatedTemplates drops templates of the same name built from other migrations and
// older than outdatedTemplateAge. Without it, every edit of a migration during development
// would leave a template database on the server for good. Best effort: the age comes from
// pg_stat_file, which needs superuser (or pg_read_server_files); without it nothing is
// dropped.
func dropOutdatedTemplates(ctx context.Context, conn *pgxpool.Conn, current string, age time.Duration) {
	want := templateNameParts.FindStringSubmatch(current)
	if want == nil {
		return
	}
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database
		WHERE starts_with(datname, $1) AND datname <> $2
		  AND (pg_stat_file('base/' || oid || '/PG_VERSION', true)).modification < now() - make_interval(secs => $3)`,
		templatePrefix, current, age.Seconds())
	// missing_ok: another process may drop a database between this query's read of
	// pg_database and its pg_stat_file, and one such error used to make the whole sweep a no-op
	// (seen in CI while the chaos suite created and dropped databases beside it).
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		got := templateNameParts.FindStringSubmatch(name)
		if got == nil || got[1] != want[1] || got[2] == want[2] {
			continue
		}
		conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)) //nolint:errcheck // best effort; fails harmlessly while being cloned
	}
}

func isMissingDB(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3D000" // invalid_catalog_name
}

func prepare(ctx context.Context, dbURL string, setup func(context.Context, *pgxpool.Pool) error) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Migrate(ctx, pool); err != nil {
		return err
	}
	if setup != nil {
		if err := setup(ctx, pool); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	return nil
}

var (
	schemaHashOnce sync.Once
	schemaHashVal  string
	schemaHashErr  error
)

// schemaHash covers Stepwise's embedded migrations and River's, so bumping either (a new
// migration file, a River upgrade) builds a new template instead of cloning a stale one.
func schemaHash() (string, error) {
	schemaHashOnce.Do(func() {
		h := sha256.New()
		all, err := migrations.All()
		if err != nil {
			schemaHashErr = err
			return
		}
		for _, m := range all {
			fmt.Fprintf(h, "stepwise %d %s\n%s\n", m.Version, m.Name, m.SQL)
		}
		migrator, err := rivermigrate.New(riverpgxv5.New(nil), nil)
		if err != nil {
			schemaHashErr = fmt.Errorf("listing River's migrations: %w", err)
			return
		}
		for _, m := range migrator.AllVersions() {
			fmt.Fprintf(h, "river %d %s\n%s\n", m.Version, m.Name, m.SQLUp)
		}
		schemaHashVal = hex.EncodeToString(h.Sum(nil))[:12]
	})
	return schemaHashVal, schemaHashErr
}

// sweepLeaked drops per-test databases left by test processes of this host that died
// before their cleanup (kill -9, a test timeout). Only called for a server on this machine:
// elsewhere a pid means nothing. With dropOwn, databases named with this process's own pid
// are dropped too: called before this process created any, they are leftovers of an earlier
// process that had the same pid.
func sweepLeaked(ctx context.Context, dropOwn bool) error {
	rows, err := admin.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", testDBPrefix)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		pid, host, ok := parseTestDBName(name)
		if !ok || host != hostTag() {
			continue
		}
		if pid == os.Getpid() && !dropOwn || pid != os.Getpid() && processAlive(pid) {
			continue
		}
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			errs = append(errs, fmt.Errorf("dropping %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// parseTestDBName splits stepwise_test_<pid>_<host>_<seq>.
func parseTestDBName(name string) (pid int, host string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(name, testDBPrefix), "_")
	if len(parts) != 3 {
		return 0, "", false
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid <= 0 {
		return 0, "", false
	}
	return pid, parts[1], true
}

var hostTagOnce = sync.OnceValue(func() string {
	h, _ := os.Hostname()
	sum := sha256.Sum256([]byte(h))
	return hex.EncodeToString(sum[:3])
})

// hostTag identifies this machine in database names, so a process never judges a pid from
// another host (sharing the server) dead.
func hostTag() string { return hostTagOnce() }

// processAlive reports whether pid exists; EPERM means it belongs to someone else.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// withDatabase returns the admin URL pointed at database name; it handles both URLs and
// keyword/value strings (where the last dbname wins).
func withDatabase(adminURL, name string) string {
	if u, err := url.Parse(adminURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		u.RawPath = ""
		return u.String()
	}
	return adminURL + " dbname=" + name
}

// serverLock takes the session advisory lock named name on a connection of the admin pool,
// waiting for it, and returns the connection and what releases both. The lock is the
// server's, so it spans every test binary of a go test ./... run; a killed binary releases
// it with its connection.
func serverLock(ctx context.Context, name string) (*pgxpool.Conn, func(), error) {
	sum := sha256.Sum256([]byte("stepwise testkit " + name))
	key := int64(binary.BigEndian.Uint64(sum[:8]))
	conn, err := admin.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to the server: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		conn.Release()
		return nil, nil, err
	}
	unlock := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
			conn.Conn().Close(ctx) //nolint:errcheck // closing the session drops the lock
		}
		conn.Release()
	}
	return conn, unlock, nil
}

// Heavy makes t wait until no other heavy test runs, in any test binary on this server, and
// keeps the others waiting until t ends. A heavy test starts fleets of processes or the
// bench's sections, each taking tens of connections (River clients, dispatchers, worker
// pools). go test ./... runs two test binaries at once, and a binary's parallel tests
// together: two heavy tests at once passed the server's max_connections (100, the default)
// in a CI run, and a test then failed on "too many clients already", not on what it tests.
func Heavy(t testing.TB) {
	t.Helper()
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	_, unlock, err := serverLock(ctx, "heavy test")
	if err != nil {
		t.Fatalf("testkit.Heavy: waiting for the other heavy tests: %v", err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("testkit.Heavy: waited %s for another heavy test to end", waited.Round(100*time.Millisecond))
	}
	t.Cleanup(unlock)
}
