package testkit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestSweepLeaked plants databases as a kill -9'ed test process would leave them and
// checks that only those of dead processes on this host are dropped.
func TestSweepLeaked(t *testing.T) {
	t.Parallel()
	requireServer(t)
	if !server.Local() {
		t.Skipf("server %s is not on this machine; sweeping is off", server.Source)
	}
	ctx := context.Background()
	dead := deadPid(t)
	leaked := fmt.Sprintf("%s%d_%s_1", testDBPrefix, dead, hostTag())
	otherHost := fmt.Sprintf("%s%d_ffffff_1", testDBPrefix, dead)
	alive := fmt.Sprintf("%s%d_%s_1", testDBPrefix, os.Getppid(), hostTag())
	for _, name := range []string{leaked, otherHost, alive} {
		_, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name))
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE template0")
		require.NoError(t, err)
		t.Cleanup(func() { admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident(name)) })
	}
	mine := DBURL(t) // this process's own databases are alive too

	require.NoError(t, sweepLeaked(ctx, false))

	exists := func(name string) bool {
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&ok))
		return ok
	}
	require.False(t, exists(leaked), "database of a dead process must be swept")
	require.True(t, exists(otherHost), "a pid of another host says nothing about its process")
	require.True(t, exists(alive), "database of a live process must stay")
	require.Contains(t, mine, testDBPrefix)
	var myName string
	require.NoError(t, poolFor(t, mine).QueryRow(ctx, "SELECT current_database()").Scan(&myName))
	require.True(t, exists(myName))
}

// TestTemplateRebuiltWhenDropped drops a template behind testkit's back, as a process of
// other migrations does with outdated ones, and checks the next clone rebuilds it.
func TestTemplateRebuiltWhenDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	setup := func(ctx context.Context, pool *pgxpool.Pool) error {
		calls.Add(1)
		_, err := pool.Exec(ctx, "CREATE TABLE merchant (id bigint PRIMARY KEY)")
		return err
	}
	name := fmt.Sprintf("rb%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	TemplateDBURL(t, name, setup)
	tpl, err := template(name, setup, false)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident(tpl)) })
	_, err = admin.Exec(ctx, "DROP DATABASE "+ident(tpl))
	require.NoError(t, err)

	var hasTable bool
	require.NoError(t, poolFor(t, TemplateDBURL(t, name, setup)).QueryRow(ctx,
		"SELECT to_regclass('merchant') IS NOT NULL").Scan(&hasTable))
	require.True(t, hasTable)
	require.EqualValues(t, 2, calls.Load(), "setup runs again for the rebuilt template")
}

// TestDropOutdatedTemplates checks that only templates of the same name and other
// migrations are dropped.
func TestDropOutdatedTemplates(t *testing.T) {
	t.Parallel()
	requireServer(t)
	ctx := context.Background()
	name := fmt.Sprintf("od%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	current := templatePrefix + name + "_aaaaaaaaaaaa"
	outdated := templatePrefix + name + "_bbbbbbbbbbbb"
	otherName := templatePrefix + name + "x_cccccccccccc"
	for _, db := range []string{current, outdated, otherName} {
		_, err := admin.Exec(ctx, "CREATE DATABASE "+ident(db)+" TEMPLATE template0")
		require.NoError(t, err)
		t.Cleanup(func() { admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident(db)) })
	}
	conn, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var superuser bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&superuser))
	if !superuser {
		t.Skip("pg_stat_file needs superuser; outdated templates are then kept")
	}

	dropOutdatedTemplates(ctx, conn, current, 0)

	exists := func(db string) bool {
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&ok))
		return ok
	}
	require.True(t, exists(current))
	require.False(t, exists(outdated), "same name, other migrations: dropped")
	require.True(t, exists(otherName), "another TemplateDB name is not ours to drop")
}

func TestParseTestDBName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		pid  int
		host string
		ok   bool
	}{
		{"stepwise_test_123_abcdef_7", 123, "abcdef", true},
		{"stepwise_test_0_abcdef_7", 0, "", false},
		{"stepwise_test_x_abcdef_7", 0, "", false},
		{"stepwise_test_123_abcdef", 0, "", false},
		{"stepwise_test_123_abc_def_7", 0, "", false},
	} {
		pid, host, ok := parseTestDBName(tt.name)
		require.Equal(t, tt.ok, ok, tt.name)
		require.Equal(t, tt.pid, pid, tt.name)
		require.Equal(t, tt.host, host, tt.name)
	}
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:p@127.0.0.1:5432/postgres?sslmode=disable": "postgres://u:p@127.0.0.1:5432/x?sslmode=disable",
		"postgresql://h/db":                "postgresql://h/x",
		"host=/tmp dbname=postgres user=u": "host=/tmp dbname=postgres user=u dbname=x",
	} {
		require.Equal(t, want, withDatabase(in, "x"), in)
	}
}

// BenchmarkFreshDB measures what each test pays for its own database: the clone from the
// migrated template, and the drop at cleanup.
func BenchmarkFreshDB(b *testing.B) {
	requireServer(b)
	ctx := context.Background()
	tpl, err := template("", nil, false)
	require.NoError(b, err)
	var create, drop time.Duration
	i := 0
	for b.Loop() {
		i++
		name := fmt.Sprintf("%s%d_%s_b%d", testDBPrefix, os.Getpid(), hostTag(), i)
		start := time.Now()
		require.NoError(b, createFromTemplate(ctx, name, tpl))
		mid := time.Now()
		_, err := admin.Exec(ctx, "DROP DATABASE "+ident(name)+" WITH (FORCE)")
		require.NoError(b, err)
		create += mid.Sub(start)
		drop += time.Since(mid)
	}
	b.ReportMetric(float64(create.Milliseconds())/float64(i), "create-ms/db")
	b.ReportMetric(float64(drop.Milliseconds())/float64(i), "drop-ms/db")
	b.ReportMetric(float64(i)/(create+drop).Seconds(), "dbs/s")
}

func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.ProcessState.Pid()
}

// The note before the package timeout tells time from a stall by the last WaitProgress that
// moved: moving within StallTimeoutDefault is time, older is a stall.
func TestTimeoutVerdict(t *testing.T) {
	now := time.Now()
	noteProgress("the date at rest", now.Add(-5*time.Second))
	v := timeoutVerdict(10*time.Minute, now)
	require.Contains(t, v, "still make progress")
	require.Contains(t, v, `"the date at rest" moved 5s ago`)
	require.Contains(t, v, "-timeout 40m")
	v = timeoutVerdict(10*time.Minute, now.Add(StallTimeoutDefault+time.Minute))
	require.Contains(t, v, "a stall")
	require.Contains(t, v, "no WaitProgress has moved for")
}
