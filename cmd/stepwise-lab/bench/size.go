package bench

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

// sizeRunsMax bounds the runs a size of the size section makes to match the largest size's
// work.
const sizeRunsMax = 100

// sizeSection settles all merchants at growing merchant counts, on one database that grows
// (merchants, and transactions of as many dates as its runs need), and shows the plan of the
// settle statement with the cursor near the end of the largest table: the time per merchant
// must not grow with the table, which needs every access to be an index lookup.
//
// Every size settles the same number of merchants, the largest size's: a smaller size in that
// many runs of its own size, one date each (at most sizeRunsMax runs), back to back. A run of
// 10,000 merchants alone lasts half a second and writes about 45 MB of WAL; the run of a
// million lasts most of a minute, writes about 4.5 GB, and meets the checkpoints that
// max_wal_size forces, each followed by the full-page images of every page first written
// after it (WAL at about 4.5 KB a merchant, as the history section measures a step's). Compared
// run against run, that was
// the run's length, not the table's size (one full run read 1.22x with single runs). With the
// same work, every size meets the same WAL volume and checkpoints; what differs is the tables.
func (r *runner) sizeSection(ctx context.Context) error {
	o := r.opts
	pool, _, err := r.sectionDB(ctx, "size")
	if err != nil {
		return err
	}
	defer pool.Close()
	// Start from no merchants: "at 10k merchants" means a table of 10k, not a prefix of the
	// template's.
	if _, err := pool.Exec(ctx, `TRUNCATE card_txn, merchant`); err != nil {
		return fmt.Errorf("emptying the size section's database: %w", err)
	}
	rig, err := newSettleRig(ctx, pool, 0, r.log)
	if err != nil {
		return err
	}
	defer rig.close()

	sizes := sortedInts(o.sizes)
	work := sizes[len(sizes)-1]
	type row struct {
		size, runs, items int
		seed              time.Duration
		elapsed           time.Duration // the runs' own time, summed
		step              time.Duration // median step, start to next start within a run
	}
	var rows []row
	var lastDate time.Time
	for _, size := range sizes {
		t := time.Now()
		if err := ensureMerchants(ctx, pool, size); err != nil {
			return err
		}
		runs := min(sizeRunsMax, (work+size-1)/size)
		dates := make([]time.Time, runs)
		for i := range dates {
			dates[i] = rig.dates.take()
		}
		if err := seedDates(ctx, pool, dates, size); err != nil {
			return err
		}
		// The seeding's pages written out before the runs, so that a checkpoint the
		// seeding's WAL requests does not land in the runs of one size alone, with the
		// full-page images that follow it: that would be the seeding's cost, not the
		// table's size. (The whole section wrote 4.8 GB of WAL in one run measured by its WAL
		// positions; with the default max_wal_size of 1 GB the server counted 13 requested
		// checkpoints in it, 3 of them these.) The runs' own checkpoints remain, the same
		// for every size since the work is. Best effort, as in the history section.
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			r.progress("size: CHECKPOINT refused (%v): the seeding's pages may be written during the runs", err)
		}
		x := row{size: size, runs: runs, seed: time.Since(t)}
		var steps []float64
		for i, date := range dates {
			rig.worker.record(true)
			m, err := rig.stepwiseRun(ctx, date, o.sizeBatch, size, fmt.Sprintf("size-%d-%d", size, i))
			starts := rig.worker.record(false)
			if err != nil {
				return err
			}
			for k := 1; k < len(starts); k++ {
				steps = append(steps, float64(starts[k].Sub(starts[k-1])))
			}
			if err := rig.verify(ctx, date, m.items); err != nil {
				return err
			}
			x.items += m.items
			x.elapsed += m.elapsed
			lastDate = date
		}
		x.step = time.Duration(median(steps))
		rows = append(rows, x)
		r.progress("size: %d merchants, %d runs: %s merchants/s, median step %s per merchant (load %s)",
			size, runs, fmtRate(float64(x.items)/x.elapsed.Seconds()), fmtDur(x.step/time.Duration(o.sizeBatch)), loadAvg())
	}

	r.printf("\n== size: Stepwise runs settling every merchant, B=%d, on a database grown to each size; every size settles about %s merchants (runs of its size over as many dates, at most %d) ==\n",
		o.sizeBatch, groupThousands(int64(work)), sizeRunsMax)
	r.printf("%-10s %5s %10s %12s %14s %16s %10s %10s %10s\n", "merchants", "runs", "settled", "merchants/s", "per merchant", "median step /B", "vs first", "runs took", "seeded in")
	first := float64(rows[0].step) / float64(o.sizeBatch)
	for _, x := range rows {
		per := float64(x.step) / float64(o.sizeBatch)
		r.printf("%-10d %5d %10s %12s %14s %16s %10.2f %10s %10s\n", x.size, x.runs, groupThousands(int64(x.items)), fmtRate(float64(x.items)/x.elapsed.Seconds()),
			fmtDur(time.Duration(float64(x.elapsed)/float64(x.items))), fmtDur(time.Duration(per)), per/first, fmtDur(x.elapsed), fmtDur(x.seed))
	}
	last := rows[len(rows)-1]
	growth := float64(last.step) / float64(rows[0].step)
	r.printf("per merchant is the runs' time / merchants; median step /B is the median time from one step's start to the next within\n" +
		"a run (the step's statements, commit and next BEGIN) per merchant, robust to other load on the machine during a long run.\n")
	r.printf("median step at %d merchants is %.2fx that at %d (target within 1.20x: %s)\n", last.size, growth, rows[0].size, verdict(growth <= 1.2))
	r.check(growth <= 1.2, "time per merchant at %d within 1.20x of at %d: %.2fx (median step)", last.size, rows[0].size, growth)

	plan, err := settlePlan(ctx, pool, lastDate, int64(last.size-2*o.sizeBatch), o.sizeBatch)
	if err != nil {
		r.printf("plan of the settle statement: not available (%v)\n", err)
		return nil
	}
	r.printf("plan of the settle statement (auto_explain, EXPLAIN ANALYZE of the step's own SQL) with the cursor at merchant %d of %d:\n", last.size-2*o.sizeBatch, last.size)
	for _, l := range plan {
		r.printf("  %s\n", l)
	}
	return nil
}

var planNode = regexp.MustCompile(`(Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan|Bitmap Index Scan) (using \S+ )?on \S+`)

// settlePlan runs settlement.SettleBatch once, in a transaction it rolls back, with
// auto_explain logging the executed plan of every statement to this session as notices; it
// returns the scan lines of the settle statement's plan. auto_explain is loaded per session
// (LOAD needs a superuser; on other servers the plan is reported as unavailable).
func settlePlan(ctx context.Context, pool *pgxpool.Pool, date time.Time, after int64, batch int) ([]string, error) {
	cfg := pool.Config().ConnConfig.Copy()
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range []string{
		`LOAD 'auto_explain'`,
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_analyze = on`,
		`SET auto_explain.log_level = notice`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := settlement.SettleBatch(ctx, tx, settlement.Batch{Date: date, Shard: 0, Shards: 1, AfterMerchant: after, Size: batch}); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	var out []string
	for _, n := range notices {
		if !strings.Contains(n, "INSERT INTO settlement") {
			continue // the payouts' insert and the session's SETs are not the cursor's query
		}
		for _, line := range strings.Split(n, "\n") {
			if planNode.MatchString(line) || strings.Contains(line, "Execution Time") || strings.HasPrefix(strings.TrimSpace(line), "duration:") {
				out = append(out, strings.TrimSpace(line))
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("auto_explain logged no plan of the settle statement (%d notices)", len(notices))
	}
	return out, nil
}

func sortedInts(xs []int) []int {
	out := slices.Clone(xs)
	slices.Sort(out)
	return slices.Compact(out)
}

// seedDates seeds the transactions of merchants 1..n for each of dates in one statement, then
// vacuums and analyzes card_txn once (see seedDate).
func seedDates(ctx context.Context, pool *pgxpool.Pool, dates []time.Time, n int) error {
	_, err := pool.Exec(ctx, `
		INSERT INTO card_txn (merchant_id, business_date, type, currency, amount, at)
		SELECT m, d, 'pos', 'EUR', 100 + (m * 7919 + g * 104729) % 9900, d + g * interval '3 hours'
		FROM unnest($1::date[]) d CROSS JOIN generate_series(1, $2::bigint) m CROSS JOIN generate_series(1, $3::int) g`,
		dates, n, txnsPerMerchant)
	if err != nil {
		return fmt.Errorf("seeding %d merchants' transactions of %d dates: %w", n, len(dates), err)
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) card_txn`); err != nil {
		return fmt.Errorf("vacuuming card_txn: %w", err)
	}
	return nil
}
