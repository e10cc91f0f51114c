package migrations_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/migrations"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

// schemaState is what a second Migrate must leave untouched.
type schemaState struct {
	Stepwise []string // version, name, applied_at
	River    []string
	Tables   []string
}

func readState(t *testing.T, pool *pgxpool.Pool) schemaState {
	t.Helper()
	ctx := context.Background()
	strs := func(sql string) []string {
		rows, err := pool.Query(ctx, sql)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	return schemaState{
		Stepwise: strs("SELECT format('%s %s %s', version, name, applied_at) FROM stepwise_migration ORDER BY version"),
		River:    strs("SELECT format('%s %s %s', line, version, created_at) FROM river_migration ORDER BY line, version"),
		Tables:   strs("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"),
	}
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.EmptyDB(t)

	require.NoError(t, migrations.Migrate(ctx, pool))
	first := readState(t, pool)
	all, err := migrations.All()
	require.NoError(t, err)
	require.Len(t, first.Stepwise, len(all))
	require.NotEmpty(t, first.River)

	require.NoError(t, migrations.Migrate(ctx, pool))
	require.Equal(t, first, readState(t, pool), "a second Migrate must change nothing")
}

// TestMigrateConcurrently starts 8 Migrate calls at once on a fresh database, each with its
// own pool, as 8 processes starting together would.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := testkit.EmptyDBURL(t)

	const n = 8
	pools := make([]*pgxpool.Pool, n)
	for i := range pools {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		pools[i] = pool
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = migrations.Migrate(ctx, pools[i])
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "Migrate #%d", i)
	}
	all, err := migrations.All()
	require.NoError(t, err)
	v, err := migrations.Version(ctx, pools[0])
	require.NoError(t, err)
	require.Equal(t, all[len(all)-1].Version, v)
	require.Len(t, readState(t, pools[0]).Stepwise, len(all), "each version applied exactly once")
}

func TestMigrateRefusesNewerDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.EmptyDB(t)
	require.NoError(t, migrations.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, "INSERT INTO stepwise_migration (version, name) VALUES (999, 'from_the_future')")
	require.NoError(t, err)

	err = migrations.Migrate(ctx, pool)
	require.ErrorIs(t, err, migrations.ErrDatabaseNewer)
	require.ErrorContains(t, err, "999")
}

// TestMigrateConcurrentlySharedPool is 8 goroutines of one process migrating through one
// pool with fewer connections than callers. Waiters once held pool connections while waiting
// for the advisory lock, so the holder never got the connection rivermigrate needs and every
// call hung; the lock now lives on a connection outside the pool.
func TestMigrateConcurrentlySharedPool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testkit.EmptyDB(t)

	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = migrations.Migrate(ctx, pool) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "Migrate #%d (pool MaxConns %d)", i, pool.Config().MaxConns)
	}
}

// CheckNotNewer reads every partial state a user's database can be in, each made the way a
// user makes it (a plain CREATE DATABASE, then River's migrator or ours), and calls a missing
// schema version 0 instead of failing on the table it lacks.
func TestCheckNotNewerOnPartialSchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	all, err := migrations.All()
	require.NoError(t, err)
	stepwiseKnown := all[len(all)-1].Version

	for _, tc := range []struct {
		name                  string
		setup                 func(t *testing.T, pool *pgxpool.Pool)
		wantStepwise, wantRiv func(st *migrations.SchemaState) bool
	}{
		{"never migrated", func(*testing.T, *pgxpool.Pool) {},
			func(st *migrations.SchemaState) bool { return st.Stepwise == 0 },
			func(st *migrations.SchemaState) bool { return st.River == 0 }},
		{"River's tables only", func(t *testing.T, pool *pgxpool.Pool) {
			migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
			require.NoError(t, err)
			_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
			require.NoError(t, err)
		},
			func(st *migrations.SchemaState) bool { return st.Stepwise == 0 },
			func(st *migrations.SchemaState) bool { return st.River == st.RiverKnown }},
		{"Stepwise's tables only", func(t *testing.T, pool *pgxpool.Pool) {
			require.NoError(t, migrations.Migrate(ctx, pool))
			_, err := pool.Exec(ctx, `DROP TABLE river_migration`)
			require.NoError(t, err)
		},
			func(st *migrations.SchemaState) bool { return st.Stepwise == stepwiseKnown },
			func(st *migrations.SchemaState) bool { return st.River == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := testkit.EmptyDB(t)
			tc.setup(t, pool)
			st, err := migrations.CheckNotNewer(ctx, pool)
			require.NoError(t, err)
			require.True(t, tc.wantStepwise(st), "Stepwise version: %+v", st)
			require.True(t, tc.wantRiv(st), "River version: %+v", st)
			require.False(t, st.Current(), "a partial schema is not current: %+v", st)
			// Migrate completes every partial state but the one whose River table is gone
			// (River's migrator would then try to create tables that exist).
			if tc.name != "Stepwise's tables only" {
				require.NoError(t, migrations.Migrate(ctx, pool))
				st, err = migrations.CheckNotNewer(ctx, pool)
				require.NoError(t, err)
				require.True(t, st.Current(), "after Migrate: %+v", st)
			}
		})
	}
}

// Version on a database nobody migrated is 0, through a pool and inside a caller's
// transaction, which stays usable. Guards against: a deploy tool that reads the version in
// its own transaction before the first migration getting "relation does not exist" and a
// transaction aborted under it.
func TestVersionOnADatabaseNobodyMigrated(t *testing.T) {
	ctx := context.Background()
	pool := testkit.EmptyDB(t)

	v, err := migrations.Version(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, v)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	v, err = migrations.Version(ctx, tx)
	require.NoError(t, err)
	require.Zero(t, v)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the caller's transaction is still usable")

	require.NoError(t, migrations.Migrate(ctx, pool))
	all, err := migrations.All()
	require.NoError(t, err)
	v, err = migrations.Version(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, all[len(all)-1].Version, v)
}
