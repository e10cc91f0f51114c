package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

// firstDate is the first business date the bench settles; every run gets the next one.
var firstDate = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// txnsPerMerchant is the bench's workload: 5 card transactions per merchant and day, all of
// one type and currency, so that each merchant settled is one sum, one settlement row, two
// ledger rows and one payout.
const txnsPerMerchant = 5

// server holds the databases the bench creates on one PostgreSQL server.
type server struct {
	adminURL string
	admin    *pgxpool.Pool
	prefix   string
	keep     bool

	mu      sync.Mutex
	created []string
}

func newServer(ctx context.Context, adminURL string, keep bool) (*server, error) {
	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return nil, fmt.Errorf("parsing the server URL: %w", err)
	}
	cfg.MaxConns = 2
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the server: %w", err)
	}
	return &server{adminURL: adminURL, admin: admin, keep: keep,
		prefix: fmt.Sprintf("stepwise_bench_%d_%d_%d", os.Getpid(), time.Now().Unix()%100000, benchSeq.Add(1))}, nil
}

// benchSeq tells apart two benches of one process started in the same second (the tests run
// the quick bench and the bank sections side by side): pid and time alone gave both the same
// template name, and one failed on "duplicate key value ... pg_database_datname_index".
var benchSeq atomic.Int64

// create makes a database named prefix_suffix, from template when it is not empty, and
// returns its URL.
func (s *server) create(ctx context.Context, suffix, template string) (name, dbURL string, err error) {
	name = s.prefix + "_" + suffix
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := s.admin.Exec(ctx, sql); err != nil {
		return "", "", fmt.Errorf("creating database %s: %w", name, err)
	}
	// The owner, for sweep: a pid means something only on the host that wrote it.
	_, _ = s.admin.Exec(ctx, "COMMENT ON DATABASE "+pgx.Identifier{name}.Sanitize()+" IS "+quoteLiteral(ownerTag()))
	s.mu.Lock()
	s.created = append(s.created, name)
	s.mu.Unlock()
	u, err := withDatabase(s.adminURL, name)
	return name, u, err
}

// close drops every database the bench created (unless --keep), even when ctx is done.
func (s *server) close() []string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer s.admin.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keep {
		for _, name := range s.created {
			// Marked, so that sweep leaves them to the person who asked to keep them.
			_, _ = s.admin.Exec(ctx, "COMMENT ON DATABASE "+pgx.Identifier{name}.Sanitize()+" IS 'kept by sample-settlement bench --keep'")
		}
		return s.created
	}
	for i := len(s.created) - 1; i >= 0; i-- {
		// FORCE: a killed worker's connection may linger for a moment.
		_, _ = s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{s.created[i]}.Sanitize()+" WITH (FORCE)")
	}
	return nil
}

// ownerTag marks a bench database with the host and pid of the bench that created it.
func ownerTag() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("sample-settlement bench: host=%s pid=%d", host, os.Getpid())
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// sweep drops the databases of benches on this host that were killed before they could drop
// their own: tagged with this host's name and a pid that no longer runs, and with nobody
// connected. Databases kept with --keep, untagged ones and those of other hosts (a server
// shared by several machines or containers, where a pid names another process) are left alone.
func (s *server) sweep(ctx context.Context) {
	host, err := os.Hostname()
	if err != nil {
		return
	}
	rows, err := s.admin.Query(ctx, `SELECT d.datname, shobj_description(d.oid, 'pg_database') FROM pg_database d
		WHERE d.datname LIKE 'stepwise\_bench\_%'
		  AND starts_with(shobj_description(d.oid, 'pg_database'), 'sample-settlement bench: host=')
		  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datid = d.oid)`)
	if err != nil {
		return
	}
	type db struct{ name, tag string }
	dbs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (db, error) {
		var d db
		return d, r.Scan(&d.name, &d.tag)
	})
	if err != nil {
		return
	}
	for _, d := range dbs {
		var tagHost string
		var pid int
		if _, err := fmt.Sscanf(d.tag, "sample-settlement bench: host=%s pid=%d", &tagHost, &pid); err != nil {
			continue
		}
		if tagHost != host || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		_, _ = s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize())
	}
}

// withDatabase returns adminURL pointing at database name. URLs and keyword/value strings
// are both accepted, as pgx accepts both.
func withDatabase(adminURL, name string) (string, error) {
	if strings.HasPrefix(adminURL, "postgres://") || strings.HasPrefix(adminURL, "postgresql://") {
		u, err := url.Parse(adminURL)
		if err != nil {
			return "", fmt.Errorf("parsing the server URL: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	return adminURL + " dbname=" + name, nil
}

// newPool opens a pool on dbURL with room for a River client's workers beside the bench's
// own connections.
func newPool(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	return newTracedPool(ctx, dbURL, maxConns, nil)
}

func newTracedPool(ctx context.Context, dbURL string, maxConns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", err)
	}
	cfg.MaxConns = maxConns
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	return pool, nil
}

// ensureMerchants makes merchants 1..n exist. Merchants are the sample's (code, shard hash,
// bank account); they are streamed with COPY so a million of them need no big slice.
func ensureMerchants(ctx context.Context, pool *pgxpool.Pool, n int) error {
	var have int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM merchant`).Scan(&have); err != nil {
		return fmt.Errorf("counting merchants: %w", err)
	}
	if have >= int64(n) {
		return nil
	}
	next := have + 1
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if next > int64(n) {
			return nil, nil
		}
		id := next
		next++
		code := settlement.MerchantCode(id)
		return []any{id, code, settlement.ShardHash(code), "Bench Merchant " + code[1:], fmt.Sprintf("EU%02d-%010d", id%97, id)}, nil
	})
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"merchant"}, []string{"id", "code", "shard_hash", "name", "bank_account"}, src); err != nil {
		return fmt.Errorf("copying merchants %d to %d: %w", have+1, n, err)
	}
	// card_txn's foreign key to merchant is planned against these statistics.
	if _, err := pool.Exec(ctx, `ANALYZE merchant`); err != nil {
		return fmt.Errorf("analyzing merchant: %w", err)
	}
	return nil
}

// seedDate writes the card transactions of date for merchants 1..n, set-based: the same
// amounts for every date, so that runs on different dates settle identical data.
func seedDate(ctx context.Context, pool *pgxpool.Pool, date time.Time, n int) error {
	_, err := pool.Exec(ctx, `
		INSERT INTO card_txn (merchant_id, business_date, type, currency, amount, at)
		SELECT m, $1::date, 'pos', 'EUR', 100 + (m * 7919 + g * 104729) % 9900, $1::date + g * interval '3 hours'
		FROM generate_series(1, $2::bigint) m CROSS JOIN generate_series(1, $3::int) g`,
		date, n, txnsPerMerchant)
	if err != nil {
		return fmt.Errorf("seeding %d merchants' transactions of %s: %w", n, date.Format(time.DateOnly), err)
	}
	// VACUUM too, not only ANALYZE: by the time a day is settled in production, autovacuum has
	// long marked the day's pages all-visible. Without it the settle statement's index-only
	// scans visit the heap for every row, and race the autovacuum the bulk insert triggers:
	// measured at a million merchants, the first fifth of the run at 8,000 merchants/s
	// instead of 25,000, an effect of how the bench seeds, not of the table's size.
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) card_txn`); err != nil {
		return fmt.Errorf("vacuuming card_txn: %w", err)
	}
	return nil
}

// machine describes where the bench ran, for the report's first lines.
func machine(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var version, buffers, syncCommit, fsync string
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('shared_buffers'),
		current_setting('synchronous_commit'), current_setting('fsync')`).Scan(&version, &buffers, &syncCommit, &fsync)
	if err != nil {
		return "", fmt.Errorf("reading the server's version and settings: %w", err)
	}
	cpu := cpuModel()
	if cpu != "" {
		cpu = " (" + cpu + ")"
	}
	return fmt.Sprintf("machine: %d CPUs%s, %s/%s, %s; PostgreSQL %s (shared_buffers=%s, synchronous_commit=%s, fsync=%s)",
		runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version(), version, buffers, syncCommit, fsync), nil
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
