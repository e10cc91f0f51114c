// Package migrations brings a database up to the schema Stepwise needs: River's own tables
// through rivermigrate (never a copy of River's SQL), then Stepwise's stepwise_* tables from
// the SQL files embedded here.
//
// # Use
//
// Call Migrate on every start of every process; it is idempotent and safe to run from many
// processes at once:
//
//	if err := migrations.Migrate(ctx, pool); err != nil {
//		log.Fatalf("migrate: %v", err)
//	}
//
// # Versions
//
// Stepwise's applied versions live in stepwise_migration. A database that has a version this
// binary does not know (a newer deploy migrated it) is refused with ErrDatabaseNewer rather
// than run against a schema the code was not written for.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

//go:embed sql/*.up.sql
var sqlFS embed.FS

// ErrDatabaseNewer is returned by Migrate when the database holds a Stepwise schema version
// newer than this binary knows. Deploy the newer binary (or roll the database back); running
// old code against a newer schema could write rows the newer code does not expect.
var ErrDatabaseNewer = errors.New("database schema is newer than this Stepwise binary")

// advisoryLockKey serialises concurrent Migrate calls across processes. Without it, two
// processes starting together would both see version N missing and race to create the same
// tables, and one would fail its start with a duplicate-table error.
const advisoryLockKey = int64(0x5354455057495345) // "STEPWISE"

// Migration is one embedded schema version.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// All returns Stepwise's migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(sqlFS, "sql")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".up.sql")
		num, rest, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %q: want NNN_name.up.sql", e.Name())
		}
		body, err := fs.ReadFile(sqlFS, "sql/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("reading migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: version, Name: rest, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("two migrations with version %d (%s, %s)", out[i].Version, out[i-1].Name, out[i].Name)
		}
	}
	return out, nil
}

// Migrate brings River's schema and then Stepwise's schema up to date. It holds a session
// advisory lock throughout, so concurrent callers wait for each other instead of racing.
// River's versions are applied by rivermigrate, each in its own transaction (some of River's
// migrations add enum values, which Postgres does not allow to be used in the transaction
// that added them); Stepwise's versions are then applied in one transaction: all or nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return errors.New("migrations.Migrate: pool is nil; pass the *pgxpool.Pool your River client uses")
	}
	// The lock is held on a connection of its own, outside the pool: callers waiting for
	// the lock must not sit on pool connections, or the holder could not get the one
	// rivermigrate needs and every caller would wait forever (seen with 8 callers on a
	// 4-connection pool).
	deadline := time.Now().Add(connectWait)
	conn, err := connectWaiting(ctx, pool.Config().ConnConfig.Copy(), deadline)
	if err != nil {
		return fmt.Errorf("connecting to migrate: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", advisoryLockKey); err != nil {
		return fmt.Errorf("taking the migration lock: %w", err)
	}
	defer func() {
		// Unlock even if ctx was cancelled: a pooled connection that kept the lock would
		// block every later Migrate until it closed.
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(unlockCtx, "SELECT pg_advisory_unlock($1)", advisoryLockKey) // closing the session drops it anyway
	}()

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("creating River migrator: %w", err)
	}
	// rivermigrate works through the pool, which may have to open a connection of its own:
	// on a server that was full a moment ago (the lock connection above waited for a free
	// one), that connection can be refused too. River's migrations are idempotent (each
	// version in its own transaction, recorded with it), so a refusal is waited out and the
	// whole call repeated, within the same bound.
	if err := whileNoFreeConnection(ctx, deadline, func() error {
		_, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		return err
	}); err != nil {
		return fmt.Errorf("migrating River's schema: %w", err)
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return migrateStepwise(ctx, tx) })
}

// connectWait bounds how long Migrate waits for the server to have a connection free.
const connectWait = 30 * time.Second

// connectWaiting opens a connection, waiting until deadline while the server refuses it for
// want of a free one (whileNoFreeConnection).
//
// Guards against: a deploy whose processes all start, and all call Migrate, at once. Each
// process opens this one connection beyond its pool; while the old processes still hold
// theirs the server can be momentarily full, and a process that gave up at once would crash
// and restart into the same crowd. (Seen in our own CI: a CLI's Migrate refused "too many
// clients" while test packages beside it held their connections for a few seconds.)
func connectWaiting(ctx context.Context, cfg *pgx.ConnConfig, deadline time.Time) (*pgx.Conn, error) {
	var conn *pgx.Conn
	err := whileNoFreeConnection(ctx, deadline, func() (err error) {
		conn, err = pgx.ConnectConfig(ctx, cfg)
		return err
	})
	return conn, err
}

// whileNoFreeConnection calls f until it returns anything but the server refusing a connection
// for want of a free one (noFreeConnection), backing off from 100 ms to 2 s, until deadline;
// then the error says which limit to raise.
func whileNoFreeConnection(ctx context.Context, deadline time.Time, f func() error) error {
	start := time.Now()
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		err := f()
		if err == nil || !noFreeConnection(err) {
			return err
		}
		if time.Now().Add(backoff).After(deadline) {
			return fmt.Errorf("the server had no connection free for %s (max_connections, or the role's CONNECTION LIMIT; "+
				"raise it, or lower the pools' MaxConns): %w", time.Since(start).Round(time.Second), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for a free connection: %w (last: %w)", ctx.Err(), err)
		case <-time.After(backoff):
		}
	}
}

// noFreeConnection reports whether err is the server refusing a connection for want of a free
// one: SQLSTATE 53300 (too_many_connections: max_connections or the role's CONNECTION LIMIT)
// or 57P03 (cannot_connect_now: the server starting up).
func noFreeConnection(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "53300" || pgErr.Code == "57P03")
}

func migrateStepwise(ctx context.Context, tx pgx.Tx) error {
	all, err := All()
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS stepwise_migration (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("creating stepwise_migration: %w", err)
	}
	applied := map[int]bool{}
	rows, err := tx.Query(ctx, "SELECT version FROM stepwise_migration")
	if err != nil {
		return fmt.Errorf("reading applied migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("reading applied migrations: %w", err)
	}
	known := map[int]bool{}
	for _, m := range all {
		known[m.Version] = true
	}
	for _, v := range versions {
		applied[v] = true
		if !known[v] {
			return fmt.Errorf("%w: database has version %d, this binary knows up to %d; deploy the newer binary",
				ErrDatabaseNewer, v, all[len(all)-1].Version)
		}
	}
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("applying migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO stepwise_migration (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return fmt.Errorf("recording migration %03d_%s: %w", m.Version, m.Name, err)
		}
	}
	return nil
}

// Version reports the newest Stepwise migration applied to the database (0 when none),
// through a pool or inside a transaction of the caller's (CheckNotNewer needs a pool, and
// says River's version too).
func Version(ctx context.Context, q stepwisetype.DBTX) (int, error) {
	// A database never migrated has no stepwise_migration: that is version 0, not an error,
	// and inside the caller's transaction an error would abort it. Two statements, as in
	// CheckNotNewer: a statement naming a missing table fails when it is parsed.
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('stepwise_migration') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("looking for stepwise_migration: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM stepwise_migration`).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading stepwise_migration: %w", err)
	}
	return v, nil
}
