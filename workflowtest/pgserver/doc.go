// Package pgserver finds a PostgreSQL server to run tests and the demo against, and starts a
// throwaway one from the machine's own PostgreSQL binaries when none is running.
//
// Your own tests of Stepwise workflows need a real PostgreSQL (Stepwise's tests never mock
// the database), and so do Stepwise's own tests, the sample service's demo, chaos suite and
// bench; this package is the one place that finds or starts it. It is public, under
// workflowtest, because a test of user code needs it as much as the SDK's tests do and a
// sample copied out of this repository must not depend on internal packages. It is not
// test-only (the demo uses it), and it never touches a server it did not start.
//
// # Where the server comes from
//
// Find tries, in order:
//
//  1. the first set variable of Opts.EnvVars (TEST_DATABASE_URL, then DATABASE_URL). A
//     set variable is a decision by the user: if that server does not answer, Find fails and
//     names the variable and the host; it never falls back to another server silently;
//  2. a server on 127.0.0.1:5432 that lets user postgres (then $PGUSER, then $USER) connect
//     to database postgres (then test) and create databases;
//  3. a throwaway cluster: initdb, pg_ctl and postgres found on PATH or in the usual install
//     directories, a fresh stepwise-pg-* directory (on /dev/shm when it is a tmpfs with 2 GB
//     free, where creating a database is ten times faster than on disk; else under the temp
//     dir), a free 127.0.0.1 port, the unix socket inside the directory, durability switched
//     off (fsync, synchronous_commit, full_page_writes: the data is thrown away anyway). Run
//     as root, the cluster runs as the unprivileged user nobody, because initdb refuses
//     root. Server.Close stops it and removes the directory;
//  4. otherwise an error that says how to install PostgreSQL or which variable to set.
//
// # Clusters left behind
//
// A process killed with kill -9 cannot stop its cluster. Each cluster directory holds the
// pid of the process that started it, and the next Find that starts a cluster stops and
// removes every stepwise-pg-* directory whose owner is dead, so killed test runs do not
// pile up postgres processes.
//
// # Testing the fallback
//
// STEPWISE_PG_SKIP_LOCAL=1 makes Find skip step 2, as Opts.SkipLocal does. It exists only
// to exercise the throwaway path on a machine that has a local server; do not set it
// otherwise.
//
// # Example
//
//	srv, err := pgserver.Find(ctx, &pgserver.Opts{Logf: log.Printf})
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer srv.Close()
//	pool, err := pgxpool.New(ctx, srv.URL)
package pgserver
