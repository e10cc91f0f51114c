package testkit_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/workflowtest"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

func init() {
	// Runs in a child process: connects to a database the parent created and writes to it.
	workflowtest.RegisterRole("testkit-insert", func(ctx context.Context, env map[string]string) error {
		conn, err := pgx.Connect(ctx, env["CHILD_DB_URL"])
		if err != nil {
			return fmt.Errorf("connecting: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, "INSERT INTO seen (who) VALUES ($1)", fmt.Sprintf("child %d", os.Getpid())); err != nil {
			return fmt.Errorf("inserting: %w", err)
		}
		fmt.Println("inserted")
		return nil
	})
}

func TestDBIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testkit.DB(t), testkit.DB(t)

	all, err := migrations.All()
	require.NoError(t, err)
	for _, pool := range []*pgxpool.Pool{a, b} {
		v, err := migrations.Version(ctx, pool)
		require.NoError(t, err)
		require.Equal(t, all[len(all)-1].Version, v)
		var riverTables int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename IN ('river_job', 'river_migration')").Scan(&riverTables))
		require.Equal(t, 2, riverTables)
	}
	_, err = a.Exec(ctx, "INSERT INTO stepwise_checkpoint (key) VALUES ('only-in-a')")
	require.NoError(t, err)
	var n int
	require.NoError(t, b.QueryRow(ctx, "SELECT count(*) FROM stepwise_checkpoint").Scan(&n))
	require.Zero(t, n, "databases of one test must not share rows")
}

// TestWiring is the harness end to end: two databases used in parallel, and a real child
// process that writes into a database this process created.
func TestWiring(t *testing.T) {
	t.Parallel()
	for i := range 2 {
		t.Run(fmt.Sprint("db", i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := testkit.DBURL(t)
			pool, err := pgxpool.New(ctx, url)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			_, err = pool.Exec(ctx, "CREATE TABLE seen (who text NOT NULL)")
			require.NoError(t, err)

			child := workflowtest.Start(t, "testkit-insert", "CHILD_DB_URL="+url)
			waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err = child.WaitForLine(waitCtx, "inserted")
			require.NoError(t, err)
			require.NoError(t, child.Wait())

			var who string
			require.NoError(t, pool.QueryRow(ctx, "SELECT who FROM seen").Scan(&who))
			require.Equal(t, fmt.Sprintf("child %d", child.Pid()), who)
		})
	}
}

func TestTemplateDBRunsSetupOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	setup := func(ctx context.Context, pool *pgxpool.Pool) error {
		calls.Add(1)
		_, err := pool.Exec(ctx, "CREATE TABLE merchant (id bigint PRIMARY KEY); INSERT INTO merchant VALUES (1), (2)")
		return err
	}
	// The name is unique per run so that this process really builds the template (and so
	// counts the setup call) instead of finding one an earlier run built.
	name := fmt.Sprintf("tk%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	for range 3 {
		pool := testkit.TemplateDB(t, name, setup)
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM merchant").Scan(&n))
		require.Equal(t, 2, n)
		_, err := pool.Exec(ctx, "INSERT INTO merchant VALUES (3)") // must not reach the template
		require.NoError(t, err)
		var hasRiver bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('river_job') IS NOT NULL").Scan(&hasRiver))
		require.True(t, hasRiver, "a TemplateDB template is migrated too")
	}
	require.EqualValues(t, 1, calls.Load())
	dropTemplate(t, name)
}

func TestEmptyDBHasNoSchema(t *testing.T) {
	t.Parallel()
	var n int
	require.NoError(t, testkit.EmptyDB(t).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&n))
	require.Zero(t, n)
}

func TestDatabaseDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	observer := testkit.DB(t)

	var name string
	t.Run("uses a database", func(t *testing.T) {
		pool := testkit.DB(t)
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&name))
		// A connection the test forgot to close must not block the drop.
		conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
		require.NoError(t, err)
		_ = conn
	})
	var exists bool
	require.NoError(t, observer.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	require.False(t, exists, "database %s must be dropped at cleanup", name)

	t.Run("drops its own database", func(t *testing.T) {
		pool := testkit.DB(t)
		var own string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&own))
		pool.Close()
		_, err := observer.Exec(ctx, "DROP DATABASE "+pgx.Identifier{own}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
		// The cleanup's drop finds nothing and must not fail this subtest.
	})
}

func dropTemplate(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	admin := testkit.DB(t)
	var tpl string
	require.NoError(t, admin.QueryRow(ctx, "SELECT datname FROM pg_database WHERE datname LIKE 'stepwise\\_tpl\\_' || $1 || '\\_%'", name).Scan(&tpl))
	_, err := admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{tpl}.Sanitize())
	require.NoError(t, err)
}
