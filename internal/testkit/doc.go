// Package testkit gives each test a PostgreSQL database of its own, quickly, and runs the
// child roles of workflowtest's process harness.
//
// # Use
//
//	func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		pool := testkit.DB(t) // fresh, migrated, dropped at cleanup
//		...
//	}
//
// # Where the server comes from
//
// Once per test process, from workflowtest/pgserver: $TEST_DATABASE_URL, then $DATABASE_URL,
// then a server on 127.0.0.1:5432, then a throwaway cluster started from the machine's own
// PostgreSQL binaries (stopped and removed by Main when the tests end). The server needs
// PostgreSQL 13 or newer (DROP DATABASE ... WITH (FORCE)) and a user allowed to create
// databases. Run go test -v to see which source was used; STEPWISE_PG_SKIP_LOCAL=1 skips the
// local server, to exercise the throwaway path.
//
// Measured on a 2-core VM: a fresh database takes about 16 ms on a throwaway cluster (on
// tmpfs) and about 170 ms on the local server, whose disk makes CREATE DATABASE's ~600 file
// creations slow; see BenchmarkFreshDB.
//
// # Per-test databases
//
// A database is cloned (CREATE DATABASE ... TEMPLATE) from a template that was migrated once
// with migrations.Migrate, which takes tens of milliseconds instead of the seconds a
// migration takes. The template's name holds a hash of every Stepwise and River migration,
// so a changed migration builds a new template rather than cloning a stale one. Templates
// are built under an advisory lock (the test binaries of go test ./... are separate
// processes) and published by renaming a finished build, so nobody clones half a schema.
// TemplateDB adds a caller's setup (business tables) to a template of its own.
//
// Per-test databases are named stepwise_test_<pid>_<host>_<n> and dropped WITH (FORCE) at
// the test's cleanup. Those of test processes that were killed before their cleanup are
// dropped by the next test process on the same host, when the server is on this machine.
//
// # Leaks
//
// Main fails a passing run whose tests left goroutines running (go.uber.org/goleak): a
// River client not stopped, a pool not closed. Goroutines that existed before the tests
// started are ignored.
package testkit
