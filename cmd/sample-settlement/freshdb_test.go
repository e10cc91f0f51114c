package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// Every command meets a database the way a user's first run does: made with a plain CREATE
// DATABASE, nothing migrated (testkit.EmptyDBURL uses no template of ours). A command that
// migrates succeeds there; one that does not refuses, names the command to run first, and
// exits non-zero. Guards against: a schema guard that only ever met migrated template
// databases in the tests, and so refused every new database a user has (the README's first
// command failed with `relation "stepwise_migration" does not exist`).
func TestEveryCommandOnANeverMigratedDatabase(t *testing.T) {
	t.Parallel()
	const date = "2026-03-02"
	migrating := []struct {
		name string
		args []string
		want string // on stdout
	}{
		{"migrate", []string{"migrate"}, "migrated"},
		{"seed", []string{"seed", "--date", date, "--merchants", "10", "--transactions", "20"}, "seeded"},
		{"settle", []string{"settle", "--date", date, "--work=false"}, ""},
		{"demo", []string{"demo", "--merchants", "20", "--transactions", "40", "--console-addr", ""}, "invariants"},
	}
	for _, tc := range migrating {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := testkit.EmptyDBURL(t)
			r := runCLI(t, append(tc.args, "--database-url", dbURL)...)
			require.Equal(t, 0, r.code, "%v on a never-migrated database: %s", tc.args, r.stderr)
			require.Contains(t, r.stdout, tc.want)
			requireCurrent(t, dbURL)
		})
	}

	notMigrating := [][]string{
		{"report", "--date", date},
		{"invariants", "--date", date},
		{"resolve", "00000000-0000-0000-0000-000000000001", "--to", "SUCCEEDED", "--reason", "checked by hand", "--actor", "ops"},
		{"resume", "settle/2026-03-02T00:00:00Z/0", "--reason", "incident fixed", "--actor", "ops"},
		{"prune", "--older-than", "720h"},
		{"statement-arrived", "--date", date, "--id", "stmt-0001"},
	}
	for _, args := range notMigrating {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			dbURL := testkit.EmptyDBURL(t)
			r := runCLI(t, append(args, "--database-url", dbURL)...)
			require.Equal(t, 1, r.code, "%v must refuse a database nobody migrated", args)
			require.Contains(t, r.stderr, "not migrated", args)
			require.Contains(t, r.stderr, `run "sample-settlement migrate" first`, args)
			requireUntouched(t, dbURL)
		})
	}

	// serve migrates by default; with --migrate=false it refuses and names the fix.
	t.Run("serve", func(t *testing.T) {
		t.Parallel()
		dbURL := testkit.EmptyDBURL(t)
		args := []string{"serve", "--addr", "127.0.0.1:0", "--scheduler=false", "--database-url", dbURL}
		p := workflowtest.Start(t, "cli", "SS_ARGS="+strings.Join(args, argsSep), "CONSOLE_USER=", "CONSOLE_PASSWORD=")
		waitCtx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		_, err := p.WaitForLine(waitCtx, "serving: ")
		require.NoError(t, err, "serve on a never-migrated database:\n%s", strings.Join(p.Lines(), "\n"))
		require.NoError(t, p.Signal(syscall.SIGTERM))
		require.NoError(t, p.Wait(), "serve after SIGTERM")
		requireCurrent(t, dbURL)
	})
	t.Run("serve --migrate=false", func(t *testing.T) {
		t.Parallel()
		dbURL := testkit.EmptyDBURL(t)
		args := []string{"serve", "--addr", "127.0.0.1:0", "--scheduler=false", "--migrate=false", "--database-url", dbURL}
		p := workflowtest.Start(t, "cli", "SS_ARGS="+strings.Join(args, argsSep))
		require.Error(t, p.Wait())
		out := strings.Join(p.Lines(), "\n")
		require.Contains(t, out, `run "sample-settlement migrate"`)
		require.NotContains(t, out, "serving: ")
		requireUntouched(t, dbURL)
	})
}

// requireCurrent: the database holds every migration this binary knows.
func requireCurrent(t *testing.T, dbURL string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	st, err := migrations.CheckNotNewer(context.Background(), pool)
	require.NoError(t, err)
	require.True(t, st.Current(), "schema after the command: %+v", st)
}

// requireUntouched: a refusing command created nothing in the database.
func requireUntouched(t *testing.T, dbURL string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var tables int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')`).Scan(&tables))
	require.Zero(t, tables, "a command that refused must leave the database as it found it")
}

// Two demos on one server: the second refuses and names the first, and the first finishes
// unharmed. Guards against: the second demo dropping and recreating the first one's database
// mid-settle. Runs on the server on 127.0.0.1:5432, where the demo puts its database when no
// URL is given (on a throwaway cluster each demo has a server of its own).
func TestTwoDemosOnOneServer(t *testing.T) { // not parallel: it sets DATABASE_URL
	conn, err := net.DialTimeout("tcp", "127.0.0.1:5432", time.Second)
	if err != nil {
		t.Skipf("no PostgreSQL on 127.0.0.1:5432 (%v): the demo would start a throwaway cluster of its own", err)
	}
	conn.Close()
	dbName := fmt.Sprintf("stepwise_demo_t%d", os.Getpid())
	t.Cleanup(func() {
		admin, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/postgres")
		if err != nil {
			return
		}
		defer admin.Close()
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)")
	})
	args := []string{"demo", "--db-name", dbName, "--merchants", "3000", "--transactions", "15000", "--console-addr", ""}
	first := workflowtest.Start(t, "cli", "SS_ARGS="+strings.Join(args, argsSep), "DATABASE_URL=")
	waitCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = first.WaitForLine(waitCtx, "database: fresh "+dbName)
	require.NoError(t, err)

	t.Setenv("DATABASE_URL", "") // the second demo, too, finds the server by itself
	r := runCLI(t, "demo", "--db-name", dbName, "--merchants", "10", "--console-addr", "")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "another demo is running on this server with database "+dbName)
	require.Contains(t, r.stderr, fmt.Sprintf("pid %d", first.Pid()), "the refusal names the running demo")
	require.Contains(t, r.stderr, "--db-name "+dbName+"_2")

	require.NoError(t, first.Wait(), "the first demo must finish unharmed:\n%s", strings.Join(first.Lines(), "\n"))
	require.Contains(t, strings.Join(first.Lines(), "\n"), "all invariants hold")
}
