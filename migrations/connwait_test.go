package migrations_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/migrations"
)

// Migrate waits for a connection when the server refuses one for want of a free one (SQLSTATE
// 53300), as in a deploy whose processes all start and migrate at once, instead of failing at
// once. A role with CONNECTION LIMIT 2 makes the server refuse exactly like a full one: the
// test holds both of its connections and lets them go one at a time, 700 ms and 1.5 s in, so
// that Migrate's lock connection gets the first free slot and the connection River's migrator
// opens through the pool is refused until the second. (Beside a CPU hog the two held
// connections' backends ended one after the other, and Migrate, which waited only for its own
// connection, failed in River's migration with "too many connections for role".)
func TestMigrateWaitsForAFreeConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := testkit.DBURL(t)
	admin, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	role := fmt.Sprintf("stepwise_connwait_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN CONNECTION LIMIT 2;
		GRANT pg_read_all_data, pg_write_all_data TO %[1]s; GRANT USAGE, CREATE ON SCHEMA public TO %[1]s`, role))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE IF EXISTS %[1]s`, role))
	})
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	roleURL := u.String()

	var held []*pgx.Conn
	for range 2 {
		c, err := pgx.Connect(ctx, roleURL)
		require.NoError(t, err)
		held = append(held, c)
	}
	_, err = pgx.Connect(ctx, roleURL)
	require.ErrorContains(t, err, "53300", "the role's limit does not refuse a third connection")

	pool, err := pgxpool.New(ctx, roleURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	start := time.Now()
	first, second := start.Add(700*time.Millisecond), start.Add(1500*time.Millisecond)
	go func() {
		time.Sleep(time.Until(first))
		_ = held[0].Close(context.Background())
		time.Sleep(time.Until(second))
		_ = held[1].Close(context.Background())
	}()
	err = migrations.Migrate(ctx, pool)
	t.Logf("Migrate returned %v after %s (connections freed after 700ms and 1.5s)", err, time.Since(start).Round(time.Millisecond))
	require.NoError(t, err)
	require.False(t, time.Now().Before(second), "Migrate returned before it could have had both connections")
	var version int
	require.NoError(t, admin.QueryRow(ctx, `SELECT max(version) FROM stepwise_migration`).Scan(&version))
	require.Positive(t, version, "Stepwise's schema was not migrated")
}
