package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/migrations"
)

// defaultBankURL is where "stepwise-lab bank" (the fake bank's server) listens by default.
const defaultBankURL = "http://127.0.0.1:8089"

// dbFlags are the flags of every command that opens the database.
type dbFlags struct {
	url string
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	f.url = os.Getenv("DATABASE_URL")
	fs.Var(secretURL{&f.url}, "database-url", "PostgreSQL URL (default $DATABASE_URL)")
}

// connect opens a pool on the database and proves it answers, so a wrong URL fails here with
// a message naming the server and the fix, not later inside some query. It is for the
// commands that do not migrate (report, invariants, resolve, resume, prune): the database
// must already hold the schema this binary needs, or the command refuses before it reads or
// writes anything and names the command to run first.
func (f *dbFlags) connect(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := f.connectSized(ctx, 0)
	if err != nil {
		return nil, err
	}
	if err := requireMigrated(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// requireMigrated refuses a database that lacks River's, Stepwise's or the sample's tables.
// Guards against: a read-only command on a database nobody migrated failing deep inside a
// query with `relation "..." does not exist`, which names neither the cause nor the fix.
func requireMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	st, err := migrations.CheckNotNewer(ctx, pool)
	if err != nil {
		return err
	}
	sample, err := settlement.SchemaApplied(ctx, pool)
	if err != nil {
		return err
	}
	if !st.Current() || !sample {
		what := "the settlement tables are missing"
		if !st.Current() {
			what = fmt.Sprintf("Stepwise schema version %d of %d, River %d of %d", st.Stepwise, st.StepwiseKnown, st.River, st.RiverKnown)
		}
		cfg := pool.Config().ConnConfig
		return fmt.Errorf("database %s:%d/%s is not migrated (%s): run \"sample-settlement migrate\" first (it is safe to run again)",
			cfg.Host, cfg.Port, cfg.Database, what)
	}
	return nil
}

// connectMigrated is connect, then settlement.Migrate, for the commands that write.
func (f *dbFlags) connectMigrated(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := f.connectSized(ctx, 0)
	if err != nil {
		return nil, err
	}
	if err := settlement.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// connectSized is connect with a connection cap (0: pgx's default).
func (f *dbFlags) connectSized(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	if f.url == "" {
		return nil, cmdline.UsageError("no database: set DATABASE_URL or --database-url (\"sample-settlement demo\" needs neither)")
	}
	return openPool(ctx, f.url, maxConns)
}

// secretURL is a string flag holding a URL that may carry a password (DATABASE_URL,
// BANK_URL). Guards against: --help printing the password as the flag's default (flag
// shows a default through String), since the default comes from the environment.
type secretURL struct{ s *string }

func (v secretURL) String() string {
	if v.s == nil || *v.s == "" {
		return ""
	}
	return cmdline.RedactURL(*v.s)
}

func (v secretURL) Set(s string) error { *v.s = s; return nil }

func openPool(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		// The parse error may quote the URL, password included.
		return nil, cmdline.UsageError("database URL is not a PostgreSQL URL such as postgres://user@host:5432/db")
	}
	if maxConns == 0 {
		// Enough for a Service with the default plan's settle workers (stepwise.NewClient
		// refuses a smaller pool); a cap, not connections opened.
		maxConns = settlement.PoolConnsFor(settlement.Plan{}.WithDefaults().Shards)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	where := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", where, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s does not answer (%w); start PostgreSQL there or fix DATABASE_URL / --database-url", where, shortNetError(err))
	}
	// Every command refuses a database migrated by a newer binary (Stepwise's schema or
	// River's), before it reads or writes anything: see migrations.CheckNotNewer.
	if _, err := migrations.CheckNotNewer(pingCtx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s: %w", where, err)
	}
	return pool, nil
}

// shortNetError keeps what matters of a connection failure ("connect: connection refused")
// rather than the driver's full multi-line account; other errors are kept whole.
func shortNetError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		return op
	}
	return err
}

// planFlags are the flags that fix how dates become runs; every process of a deployment
// must use the same values.
type planFlags struct {
	shards int
	spec   string
	zone   string
}

func (f *planFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.shards, "shards", envInt("SETTLE_SHARDS", 4), "runs per date, one per merchant shard; the same in every process (default $SETTLE_SHARDS or 4)")
	fs.StringVar(&f.spec, "schedule", envOr("SETTLE_SCHEDULE", "0 1 * * *"), "daily cron time at which the previous day is settled ($SETTLE_SCHEDULE)")
	fs.StringVar(&f.zone, "zone", envOr("SETTLE_ZONE", "UTC"), "IANA time zone of business dates and the schedule ($SETTLE_ZONE)")
}

func (f *planFlags) plan() (settlement.Plan, error) {
	// Plan treats 0 as "the default, 4": from the command line that is a typo, and a
	// process whose shard count differs from the others' splits dates differently.
	if err := cmdline.CheckInt("shards", f.shards, 1, maxShards); err != nil {
		return settlement.Plan{}, err
	}
	p, err := settlement.Plan{Spec: f.spec, Zone: f.zone, Shards: f.shards}.Compile()
	if err != nil {
		return p, cmdline.UsageError("--shards/--schedule/--zone: %v", err)
	}
	return p, nil
}

// parseDateFlag parses --date, naming the flag in the error.
func parseDateFlag(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, cmdline.UsageError("--date is required: the business date to act on, YYYY-MM-DD")
	}
	d, err := settlement.ParseDate(s)
	if err != nil {
		return time.Time{}, cmdline.UsageError("--date %q: want YYYY-MM-DD, e.g. 2026-03-01", s)
	}
	return d, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	var n int
	if v := os.Getenv(name); v != "" {
		if _, err := fmt.Sscan(v, &n); err == nil {
			return n
		}
	}
	return def
}

// newLogger logs to stderr at the level asked for.
func newLogger(stderr interface{ Write([]byte) (int, error) }, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}
