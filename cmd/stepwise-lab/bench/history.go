package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/retention"
)

// The history section: does a ledger that holds years cost the step path anything? Two
// databases side by side, both cloned from the template: a fresh one, and one seeded with a
// long finished history (--history-ops operations, --history-runs runs, their audit events,
// 90% of it older than the retention age). Each round measures the same four things on both,
// twice each, in the order ABBA (the sides swapping by round), and the per-round ratios
// history/fresh are the result:
//
//   - step: the median step of a Stepwise run settling --history-merchants merchants at B=100
//     (its statements, the payouts' Enqueue, the fenced cursor, the commit), as merchants/s;
//   - delivery: Outbox.Drain of the run's payouts to the zero-latency fake bank (the ledger's
//     claims, request rows, outcomes), payouts/s;
//   - enqueue: outbox.Enqueue of historyEnqueueOps operations in transactions of 100, as steps
//     enqueue them, time per operation;
//   - claim: checkpoint.Ensure + Claim + Release of a new key (what a run's first claim does
//     to the checkpoint table and the audit trail), time per claim.
//
// Then retention.Prune deletes the history's old events beside a settle loop on the history
// database, in windows: each prune window is paired with a quiet window right before or after
// it (the order alternating), both with Stepwise steps running, and the pair's ratio is the
// mean step time while pruning over the mean step time without. The prune is one pass, held
// between two batches through each quiet window (prunePass); a prune window lasts
// --history-window and then until the pass is held (the batch under way, or the pause under
// way and the batch after it, committed).
const (
	historyBatch   = 100
	historyAge     = 30 * 24 * time.Hour
	historyEnqKind = "bench-history"
)

// historyEnqueueOps is how many operations the enqueue measurement writes per round and
// database, and historyClaims how many new keys the claim measurement claims: sized with the
// run, so that --quick stays small. The enqueue writes as many operations as a run settles
// merchants: at a fifth of that (1,000, about 40 ms a measurement) single rounds ranged
// 0.67-1.17 and two 9-round medians were 0.93 and 0.82. The seeded history's random-key
// operations spread over as many merchants (the same M0000000… keys enqueue-random writes), so
// that its keys land among theirs.
func historyEnqueueOps(o *options) int { return max(100, o.historyMerchants) }
func historyClaims(o *options) int     { return max(20, o.historyMerchants/25) }

// historyDB is one side of the comparison: a database, the settle rig on it, the sample's
// Service (its outbox delivers to a zero-latency fake bank), a checkpoint store, and an outbox
// registering the kind the enqueue measurement writes (never delivered, so it does not mix
// into the delivery measurement).
type historyDB struct {
	label string
	pool  *pgxpool.Pool
	rig   *settleRig
	svc   *sample
	store *checkpoint.Store
	close func()
}

func (r *runner) openHistoryDB(ctx context.Context, label string) (*historyDB, error) {
	pool, _, err := r.sectionDB(ctx, "history_"+label)
	if err != nil {
		return nil, err
	}
	h := &historyDB{label: label, pool: pool}
	var closers []func()
	h.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	closers = append(closers, pool.Close)
	fail := func(err error) (*historyDB, error) { h.close(); return nil, err }
	if err := ensureMerchants(ctx, pool, r.opts.historyMerchants); err != nil {
		return fail(err)
	}
	_, client, stopBank, err := startBank()
	if err != nil {
		return fail(err)
	}
	closers = append(closers, stopBank)
	if h.svc, err = sampleService(pool, client); err != nil {
		return fail(err)
	}
	if h.rig, err = newSettleRig(ctx, pool, 0, r.log); err != nil {
		return fail(err)
	}
	closers = append(closers, h.rig.close)
	if h.store, err = checkpoint.New(pool, &checkpoint.Config{}); err != nil {
		return fail(err)
	}
	enq, err := outbox.New(pool, &outbox.Config{Logger: quietLogger(), Kinds: map[string]*outbox.KindConfig{
		historyEnqKind: {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			return outbox.Receipt{}, outbox.NotSent(errors.New("the history section's enqueued operations are never sent"))
		})},
	}})
	if err != nil {
		return fail(err)
	}
	if err := enq.Register(ctx); err != nil {
		return fail(err)
	}
	return h, nil
}

// verify checks that a run settled exactly merchants 1..items of date, as settleRig.verify
// does, but counts the run's payouts by its run key (an index) rather than by a pattern on the
// business key: on a ledger of 10M operations that pattern is a scan of the whole ledger,
// which would dwarf the steps it follows and load the machine during the prune windows.
func (h *historyDB) verify(ctx context.Context, date time.Time, tag string, items int) error {
	runKey := fmt.Sprintf("settle/%s/%s", date.Format(time.DateOnly), tag) // as stepwiseRun names it
	var settlements, entries, payouts int
	err := h.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM settlement WHERE settle_date = $1),
		(SELECT count(*) FROM ledger_entry l JOIN settlement s ON s.id = l.settlement_id WHERE s.settle_date = $1),
		(SELECT count(*) FROM stepwise_operation WHERE run_key = $2 AND kind = $3)`,
		date, runKey, settlement.PayoutKind).Scan(&settlements, &entries, &payouts)
	if err != nil {
		return fmt.Errorf("verifying the run of %s: %w", date.Format(time.DateOnly), err)
	}
	if settlements != items || entries != 2*items || payouts != items {
		return fmt.Errorf("run %s settled %d merchants with %d ledger entries and %d payouts; want %d, %d, %d",
			runKey, settlements, entries, payouts, items, 2*items, items)
	}
	return nil
}

// seedHistory writes a long finished history set-based (generate_series, as the console's
// bench does), in chunks so that progress shows: runs (their checkpoints, one run.finish
// event each), ops operations SUCCEEDED (10 per run, one request and one op.transition event
// each), and 90% of all of it older than the retention age, spread over the year before.
func (r *runner) seedHistory(ctx context.Context, pool *pgxpool.Pool, ops, runs int) error {
	old := runs * 9 / 10
	// at(j) is when run j finished: the old ones spread over 400 to 31 days ago, the rest
	// over the last day (younger than the age, kept by Prune).
	const at = `CASE WHEN j < $2 THEN now() - interval '400 days' + make_interval(secs => j * (369 * 86400.0 / greatest($2, 1)))
		ELSE now() - interval '23 hours' + make_interval(secs => (j - $2) * (22 * 3600.0 / greatest($3 - $2, 1))) END`
	began := time.Now()
	const chunk = 1_000_000
	for lo := 0; lo < runs; lo += chunk {
		hi := min(lo+chunk, runs)
		for _, sql := range []string{
			`INSERT INTO stepwise_checkpoint (key, cursor, fencing_token, steps, created_at, updated_at)
				SELECT 'hist/run/' || j, '{"after_merchant": 20000}', 1, 200, t, t
				  FROM generate_series($1::int, $4::int - 1) j, LATERAL (SELECT ` + at + ` AS t) tt`,
			`INSERT INTO stepwise_run (key, workflow, input, status, shard, attempts, created_at, updated_at, finished_at)
				SELECT 'hist/run/' || j, 'settle_merchants', jsonb_build_object('date', to_char(t, 'YYYY-MM-DD'), 'shard', j % 8, 'shards', 8),
				       'succeeded', j % 8, 1, t - interval '2 minutes', t, t
				  FROM generate_series($1::int, $4::int - 1) j, LATERAL (SELECT ` + at + ` AS t) tt`,
			`INSERT INTO stepwise_event (subject, kind, actor, token, attempt, at)
				SELECT 'hist/run/' || j, 'run.finish', 'worker/job-' || j || '/attempt-1', 1, 1, t
				  FROM generate_series($1::int, $4::int - 1) j, LATERAL (SELECT ` + at + ` AS t) tt`,
		} {
			if _, err := pool.Exec(ctx, sql, lo, old, runs, hi); err != nil {
				return fmt.Errorf("seeding runs %d to %d: %w", lo, hi, err)
			}
		}
		r.progress("history: seeded %s of %s runs (%s)", groupThousands(int64(hi)), groupThousands(int64(runs)), time.Since(began).Round(time.Second))
	}
	for lo := 0; lo < ops; lo += chunk {
		hi := min(lo+chunk, ops)
		// Operation i belongs to run i % runs and finished a minute after it, with one
		// request and one event (its last transition). The even ones are payouts as the
		// sample makes them: keys that start with the business date, dated ids (the layout
		// of outbox.DatedOperationID, not its values: the date's Unix milliseconds, version
		// 8, an md5 where the function has a SHA-1). The odd ones are of the kind the enqueue
		// measures write, as a caller of OperationID writes them: random ids, keys that start
		// with one of the merchants those measures enqueue for. So the ledger is one that
		// moved to dated ids halfway: its primary key, request key and event subjects hold
		// 5M random ids each. Business dates end the day before the bench's first date
		// (firstDate), so that the runs measured settle dates after every date of the
		// history, as a service does, and the rig's verify (payouts of a date) counts none of
		// these.
		if _, err := pool.Exec(ctx, `
			WITH ops AS (
				INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, amount, currency, run_key,
					state, attempts, claims, claimed_at, last_sent_at, external_ref, created_at, updated_at, finished_at)
				SELECT CASE WHEN i % 2 = 0
				         THEN (lpad(to_hex((extract(epoch FROM bd::timestamp) * 1000)::bigint), 12, '0') || '8' || substr(h, 1, 3) || '9' || substr(h, 4, 15))::uuid
				         ELSE gen_random_uuid() END,
				       kind, bk, p, sha256(convert_to(p::text, 'UTF8')), 100 + i % 9900, 'EUR', 'hist/run/' || j,
				       'SUCCEEDED', 1, 1, t - interval '1 minute', t, 'bank-' || i, t - interval '1 minute', t, t
				  FROM generate_series($1::int, $4::int - 1) i,
				       LATERAL (SELECT i % $3 AS j) jj,
				       LATERAL (SELECT `+at+` AS t) tt,
				       LATERAL (SELECT $5::date - (now()::date - t::date) AS bd) bb,
				       LATERAL (SELECT CASE WHEN i % 2 = 0 THEN 'payout' ELSE $7 END AS kind,
				                       CASE WHEN i % 2 = 0 THEN to_char(bd, 'YYYY-MM-DD') || '/H' || lpad(i::text, 8, '0') || '/pos/EUR'
				                            ELSE 'M' || lpad(((i / 2) % $6)::text, 7, '0') || '/' || to_char(bd, 'YYYY-MM-DD') || '/h' || i END AS bk) kk,
				       LATERAL (SELECT md5(kind || bk) AS h) hh,
				       LATERAL (SELECT jsonb_build_object('settlement_id', i, 'merchant', 'H' || lpad(i::text, 8, '0'),
				                                          'account', 'EU00-' || lpad(i::text, 10, '0')) AS p) pp
				RETURNING operation_id, last_sent_at, finished_at),
			ev AS (
				INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, attempt, at)
				SELECT 'op:' || operation_id, 'op.transition', 'PROCESSING', 'SUCCEEDED', 'outbox', 1, finished_at FROM ops)
			INSERT INTO stepwise_operation_request (operation_id, claim, actor, started_at, ended_at, outcome, recorded_at)
			SELECT operation_id, 1, 'outbox', last_sent_at, finished_at, 'SUCCEEDED', finished_at FROM ops`,
			lo, old, runs, hi, firstDate.AddDate(0, 0, -1).Format(time.DateOnly), historyEnqueueOps(r.opts), historyEnqKind); err != nil {
			return fmt.Errorf("seeding operations %d to %d: %w", lo, hi, err)
		}
		r.progress("history: seeded %s of %s operations (%s)", groupThousands(int64(hi)), groupThousands(int64(ops)), time.Since(began).Round(time.Second))
	}
	for _, t := range []string{"stepwise_checkpoint", "stepwise_run", "stepwise_operation", "stepwise_event", "stepwise_operation_request"} {
		if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+t); err != nil {
			return fmt.Errorf("vacuuming %s: %w", t, err)
		}
	}
	r.progress("history: vacuumed and analyzed (%s in all)", time.Since(began).Round(time.Second))
	r.settleHistory(ctx, pool)
	return nil
}

// historyRandomIndexes are the large indexes of the history that the write paths maintain:
// the operation's id and business key, its requests' key and the events' subject. With
// OperationID's random ids (the enqueue-random measure) each write lands at a random position
// in them (see "A long history" in docs/design.md); with dated ids and date-first keys, at
// their end.
var historyRandomIndexes = []string{"stepwise_operation_pkey", "stepwise_operation_kind_business_key_key", "stepwise_event_subject_idx", "stepwise_operation_request_pkey"}

// settleHistory brings the seeded history to the state of a ledger that grew over years on a
// server that has been up: its seeding written out, and the indexes every write touches at a
// random position as cached as the server's memory lets them be. Without it the rounds
// measured the seeding's aftermath, not the history: the checkpoint after a 10 GB seeding
// writes gigabytes during the rounds (on both databases alike: the fresh one's steps fell
// from 12,800/s to 7,400/s over 5 rounds at shared_buffers 4 GB), and the random-position
// indexes start cold, where a server in steady state holds what its memory can. Both steps
// are best effort: a user without the rights is told, and the rounds run anyway.
func (r *runner) settleHistory(ctx context.Context, pool *pgxpool.Pool) {
	began := time.Now()
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		r.progress("history: CHECKPOINT refused (%v): the seeding's pages are written during the rounds, which then read low", err)
	} else {
		r.progress("history: checkpoint after the seeding done (%s)", time.Since(began).Round(time.Second))
	}
	began = time.Now()
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_prewarm"); err != nil {
		r.progress("history: no pg_prewarm (%v): the random-position indexes start cold", err)
		return
	}
	var mb int64
	var sharedBuffers string
	if err := pool.QueryRow(ctx, `SELECT (coalesce(sum(pg_prewarm(c.oid::regclass) * current_setting('block_size')::bigint), 0) / (1024 * 1024))::bigint,
			current_setting('shared_buffers')
		FROM pg_class c WHERE c.relname = ANY($1)`, historyRandomIndexes).Scan(&mb, &sharedBuffers); err != nil {
		r.progress("history: prewarming the random-position indexes failed (%v): they start cold", err)
		return
	}
	r.progress("history: prewarmed %d MB of random-position indexes (%s) into shared_buffers %s (%s)",
		mb, strings.Join(historyRandomIndexes, ", "), sharedBuffers, time.Since(began).Round(time.Second))
}

// historyMeasures are the per-round measurements, in the order they run.
var historyMeasures = []string{"step", "delivery", "enqueue", "enqueue-random", "claim"}

// historyRound is one measurement on one database: a rate (higher is better) and its unit.
type historyRound struct {
	rate  float64
	unit  string
	items int
	db    time.Duration // the server's CPU time over the timed part (negative: not measured)
}

// walUse is the WAL the cluster wrote between two LSNs: its bytes and, of those, the
// full-page images' (pg_walinspect; -1 where the extension is not available). It is
// cluster-wide: the other side's autovacuum and the checkpointer count too, so it is summed
// over every round.
type walUse struct{ bytes, fpi float64 }

// checkpoints is the server's checkpoint counters and the settings that space checkpoints.
type checkpoints struct {
	req, timed                                  int64
	sharedBuffers, maxWAL, timeout, compression string
}

func readCheckpoints(ctx context.Context, pool *pgxpool.Pool) (checkpoints, error) {
	var c checkpoints
	if err := pool.QueryRow(ctx, `SELECT current_setting('shared_buffers'), current_setting('max_wal_size'),
		current_setting('checkpoint_timeout'), current_setting('wal_compression')`).Scan(&c.sharedBuffers, &c.maxWAL, &c.timeout, &c.compression); err != nil {
		return c, err
	}
	// PostgreSQL 17 moved the counters to pg_stat_checkpointer; where neither answers, the
	// report says the count is unknown.
	if pool.QueryRow(ctx, `SELECT checkpoints_req, checkpoints_timed FROM pg_stat_bgwriter`).Scan(&c.req, &c.timed) != nil &&
		pool.QueryRow(ctx, `SELECT num_requested, num_timed FROM pg_stat_checkpointer`).Scan(&c.req, &c.timed) != nil {
		c.req, c.timed = -1, -1
	}
	return c, nil
}

func walLSN(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walBetween is the WAL written between two LSNs, with its full-page images where inspect
// (pg_walinspect) can read them (fpi -1 where not).
func walBetween(ctx context.Context, pool *pgxpool.Pool, inspect bool, from, to string) (walUse, error) {
	w := walUse{fpi: -1}
	if inspect {
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(combined_size), 0)::float8, coalesce(sum(fpi_size), 0)::float8
			FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn)`, from, to).Scan(&w.bytes, &w.fpi)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "58P01" /* undefined_file */ {
			return w, err
		}
		// The checkpointer removed a segment of the range before it was read: on a busy
		// server (another workload's WAL beside the bench's) a checkpoint can come within one
		// measure. It failed the whole section after 40 minutes of seeding and rounds; the
		// bytes still come from the LSNs, the full-page images of that measure are unknown.
		w.fpi = -1
	}
	err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::float8`, from, to).Scan(&w.bytes)
	return w, err
}

func (r *runner) historySection(ctx context.Context) error {
	o := r.opts
	fresh, err := r.openHistoryDB(ctx, "fresh")
	if err != nil {
		return err
	}
	defer fresh.close()
	hist, err := r.openHistoryDB(ctx, "long")
	if err != nil {
		return err
	}
	defer hist.close()
	r.progress("history: seeding %s operations and %s runs into the history database", groupThousands(int64(o.historyOps)), groupThousands(int64(o.historyRuns)))
	seedStart := time.Now()
	if err := r.seedHistory(ctx, hist.pool, o.historyOps, o.historyRuns); err != nil {
		return err
	}
	seeded := time.Since(seedStart)
	var sizes string
	if err := hist.pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_database_size(current_database()))`).Scan(&sizes); err != nil {
		return err
	}

	// Warm-up on each side, not counted: the first run of a rig pays River's start.
	for _, h := range []*historyDB{fresh, hist} {
		if _, err := r.historyMeasure(ctx, h, "step", "warmup"); err != nil {
			return err
		}
		if _, err := r.historyMeasure(ctx, h, "delivery", "warmup"); err != nil {
			return err
		}
	}
	// The checkpoints taken during the rounds, and what spaces them: each one makes the next
	// write to every page a full-page image, which a long ledger's random-position index
	// inserts pay on nearly every operation (see "WAL per item" in the report).
	ckpt0, err := readCheckpoints(ctx, hist.pool)
	if err != nil {
		return err
	}
	roundsStart := time.Now()
	ratios := map[string][]float64{}
	best := map[string]map[string]float64{"fresh": {}, "long": {}}
	// WAL per item on each side: a long ledger's indexes take each insert at a random
	// position (operation ids are UUID v5 of kind and business key, by design), so more of
	// its writes land on pages not yet written since the last checkpoint, which cost a
	// full-page image each.
	wal := map[string]map[string]walUse{"fresh": {}, "long": {}}
	walItems := map[string]map[string]int{"fresh": {}, "long": {}}
	fpiLost := map[string]map[string]int{"fresh": {}, "long": {}} // measures whose WAL was removed before it was read
	_, err = hist.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	inspect := err == nil
	if !inspect {
		r.progress("history: no pg_walinspect (%v): WAL bytes only, no full-page images", err)
	}
	units := map[string]string{}
	// The server's CPU time per item, each side's over every round: what a long ledger costs
	// the database's cores, beside what it costs the process's rate.
	dbUse := map[string]map[string]time.Duration{"fresh": {}, "long": {}}
	dbItems := map[string]map[string]int{"fresh": {}, "long": {}}
	for round := range o.historyRounds {
		// ABBA: each side runs its measures twice per round, first and last or in the
		// middle (alternating by round), and its rate is the mean of the two. Measured on
		// the shared machine, the side that ran second in an AB round was slower by up to
		// 2x whichever it was (the first side's writes are flushed and vacuumed meanwhile):
		// AB/BA alternation left that in every single round.
		a, b := fresh, hist
		if round%2 == 1 {
			a, b = hist, fresh
		}
		sum := map[string]map[string]float64{"fresh": {}, "long": {}}
		for i, h := range []*historyDB{a, b, b, a} {
			for _, m := range historyMeasures {
				lsn0, err := walLSN(ctx, hist.pool)
				if err != nil {
					return err
				}
				res, err := r.historyMeasure(ctx, h, m, fmt.Sprintf("r%d-%d", round, i))
				if err != nil {
					return err
				}
				lsn1, err := walLSN(ctx, hist.pool)
				if err != nil {
					return err
				}
				w, err := walBetween(ctx, hist.pool, inspect, lsn0, lsn1)
				if err != nil {
					return err
				}
				if inspect && w.fpi < 0 {
					fpiLost[h.label][m]++
				}
				wal[h.label][m] = walUse{bytes: wal[h.label][m].bytes + w.bytes, fpi: wal[h.label][m].fpi + max(w.fpi, 0)}
				walItems[h.label][m] += res.items
				if res.db >= 0 {
					dbUse[h.label][m] += res.db
					dbItems[h.label][m] += res.items
				}
				sum[h.label][m] += res.rate / 2
				best[h.label][m] = max(best[h.label][m], res.rate)
				units[m] = res.unit
			}
		}
		line := ""
		for _, m := range historyMeasures {
			ratio := sum["long"][m] / sum["fresh"][m]
			ratios[m] = append(ratios[m], ratio)
			line += fmt.Sprintf(" %s %.2f (%s/%s)", m, ratio, fmtRate(sum["long"][m]), fmtRate(sum["fresh"][m]))
		}
		r.progress("history: round %d/%d, history/fresh:%s (load %s)", round+1, o.historyRounds, line, loadAvg())
	}

	r.printf("\n== history: a ledger of %s operations and %s runs (seeded in %s, database %s) against a fresh one; ratios = history/fresh, median of %d paired rounds [range] ==\n",
		groupThousands(int64(o.historyOps)), groupThousands(int64(o.historyRuns)), fmtDur(seeded), sizes, o.historyRounds)
	ckpt1, err := readCheckpoints(ctx, hist.pool)
	if err != nil {
		return err
	}
	counts := "checkpoint counters unavailable"
	if ckpt0.req >= 0 && ckpt1.req >= 0 {
		counts = fmt.Sprintf("%d checkpoints in the %s of rounds (%d forced by WAL volume, %d timed)", ckpt1.req+ckpt1.timed-ckpt0.req-ckpt0.timed,
			fmtDur(time.Since(roundsStart)), ckpt1.req-ckpt0.req, ckpt1.timed-ckpt0.timed)
	}
	r.printf("server: shared_buffers %s, max_wal_size %s, checkpoint_timeout %s, wal_compression %s; %s\n",
		ckpt1.sharedBuffers, ckpt1.maxWAL, ckpt1.timeout, ckpt1.compression, counts)
	r.printf("%-14s %16s %16s %20s  %s\n", "measure", "fresh (best)", "history (best)", "history/fresh", "what")
	what := map[string]string{
		"step":           fmt.Sprintf("steps of a Stepwise run settling %d merchants at B=%d (statements, payouts' Enqueue, fenced cursor, commit): B / median step", o.historyMerchants, historyBatch),
		"delivery":       "Outbox.Drain of that run's payouts to the zero-latency fake bank (claims, requests, outcomes)",
		"enqueue":        fmt.Sprintf("outbox.Enqueue of %d operations in transactions of %d, dated ids and date-first keys (as the sample)", historyEnqueueOps(o), historyBatch),
		"enqueue-random": "the same with OperationID's random ids and merchant-first keys, as the history's operations of its kind",
		"claim":          fmt.Sprintf("checkpoint Ensure + Claim + Release of %d new keys", historyClaims(o)),
	}
	for _, m := range historyMeasures {
		ps := ratios[m]
		r.printf("%-14s %16s %16s %20s  %s\n", m, fmtRate(best["fresh"][m])+" "+units[m], fmtRate(best["long"][m])+" "+units[m],
			fmt.Sprintf("%.2f [%.2f-%.2f]", median(ps), slices.Min(ps), slices.Max(ps)), what[m])
	}
	r.printf("WAL per item over every round (cluster-wide, between flush LSNs): all, and of it full-page images; fresh -> history\n")
	for _, m := range historyMeasures {
		per := func(label string) walUse {
			n := float64(max(1, walItems[label][m]))
			return walUse{bytes: wal[label][m].bytes / n, fpi: wal[label][m].fpi / n}
		}
		f, l := per("fresh"), per("long")
		fpi := "(no pg_walinspect)"
		switch lost := fpiLost["fresh"][m] + fpiLost["long"][m]; {
		case inspect && lost > 0:
			fpi = fmt.Sprintf("FPI unknown: %d of the measures' WAL was removed by a checkpoint before it was read", lost)
		case inspect:
			fpi = fmt.Sprintf("FPI %8s -> %8s B", groupThousands(int64(f.fpi)), groupThousands(int64(l.fpi)))
		}
		r.printf("  %-14s %8s -> %8s B   %s\n", m, groupThousands(int64(f.bytes)), groupThousands(int64(l.bytes)), fpi)
	}
	if r.serverCPU != nil {
		r.printf("database CPU per item over every round (the whole server's), and items per second of it (per db core); fresh -> history\n")
		for _, m := range historyMeasures {
			f, l := dbItems["fresh"][m], dbItems["long"][m]
			r.printf("  %-14s %8s -> %8s   %9s -> %9s /s\n", m, fmtCPUPer(dbUse["fresh"][m], f), fmtCPUPer(dbUse["long"][m], l),
				fmtPerCore(f, dbUse["fresh"][m]), fmtPerCore(l, dbUse["long"][m]))
		}
	}
	if err := r.printIndexDepths(ctx, fresh, hist); err != nil {
		return err
	}
	for _, m := range historyMeasures {
		if m == "enqueue-random" {
			continue // what random ids cost, beside the target; not a target
		}
		ps := ratios[m]
		r.check(median(ps) >= 0.90, "history/fresh >= 0.90 for %s with %s operations: %s", m, groupThousands(int64(o.historyOps)), ratioAgainst(median(ps), 0.90))
	}
	return r.historyPrune(ctx, hist)
}

// printIndexDepths prints, for each B-tree index of stepwise_operation, the pages one
// descent from its fast root to a leaf reads on the fresh ledger and on the long one, and each
// index's size. With dated ids a day's inserts land together in each index (at the end of
// their day's, or their kind and state's, range), and one thing a long ledger still adds to
// each is depth: a page more for every extra level of each index the row enters (a level per
// a hundred-odd times more rows). The depth is the fast root's level + 1 (where a search
// starts: pageinspect's bt_metap). A role that is not a superuser may not install or call it,
// and a server may lack the contrib package: then the line says so and the section goes on.
// Any other error (the query itself) fails the section, so that CI sees it.
func (r *runner) printIndexDepths(ctx context.Context, fresh, long *historyDB) error {
	const title = "B-tree pages a descent reads (pageinspect's bt_metap: fast root's level + 1) and index pages, of stepwise_operation's indexes; fresh -> history"
	var sides [2]map[string]indexSize // fresh, long
	for i, h := range []*historyDB{fresh, long} {
		d, err := indexDepths(ctx, h)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42501" /* insufficient_privilege */ || pgErr.Code == "58P01" /* undefined_file: no contrib */) {
			r.printf("%s: not read (%v)\n", title, err)
			return nil
		}
		if err != nil {
			return err
		}
		sides[i] = d
	}
	r.printf("%s\n", title)
	for _, n := range slices.Sorted(maps.Keys(sides[0])) {
		f, l := sides[0][n], sides[1][n]
		r.printf("  %-42s %d -> %d   %9s -> %9s pages\n", n, f.depth, l.depth, groupThousands(f.pages), groupThousands(l.pages))
	}
	return nil
}

// indexSize is a B-tree index's depth (the pages a descent from its fast root reads) and size.
type indexSize struct{ depth, pages int64 }

// indexDepths returns the depth and size of each B-tree index of stepwise_operation, by name.
func indexDepths(ctx context.Context, h *historyDB) (map[string]indexSize, error) {
	if _, err := h.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pageinspect`); err != nil {
		return nil, fmt.Errorf("CREATE EXTENSION pageinspect: %w", err)
	}
	rows, err := h.pool.Query(ctx, `
		SELECT ic.relname::text, (bt_metap(ic.oid::regclass::text)).fastlevel + 1,
		       pg_relation_size(ic.oid) / current_setting('block_size')::int
		  FROM pg_index i
		  JOIN pg_class ic ON ic.oid = i.indexrelid
		  JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'btree'
		 WHERE i.indrelid = 'stepwise_operation'::regclass`)
	if err != nil {
		return nil, fmt.Errorf("bt_metap: %w", err)
	}
	d := map[string]indexSize{}
	for rows.Next() {
		var name string
		var v indexSize
		if err := rows.Scan(&name, &v.depth, &v.pages); err != nil {
			rows.Close()
			return nil, fmt.Errorf("bt_metap: %w", err)
		}
		d[name] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("bt_metap: %w", err)
	}
	return d, nil
}

// historyMeasure runs measure m once on h and returns its rate.
func (r *runner) historyMeasure(ctx context.Context, h *historyDB, m, tag string) (historyRound, error) {
	o := r.opts
	switch m {
	case "step":
		date, err := h.rig.newDate(ctx, o.historyMerchants)
		if err != nil {
			return historyRound{}, err
		}
		// The step's cost is the median time from one step's start to the next (its
		// statements, commit and next BEGIN): River's pickup of the run, which varies by
		// its poll, is not the ledger's doing.
		h.rig.worker.record(true)
		db := r.dbCPU()
		res, err := h.rig.stepwiseRun(ctx, date, historyBatch, o.historyMerchants, "hist-"+tag)
		dbUsed := db.used()
		starts := h.rig.worker.record(false)
		if err != nil {
			return historyRound{}, fmt.Errorf("history (%s database): %w", h.label, err)
		}
		if err := h.verify(ctx, date, "hist-"+tag, res.items); err != nil {
			return historyRound{}, fmt.Errorf("history (%s database): %w", h.label, err)
		}
		var steps []float64
		for i := 1; i < len(starts); i++ {
			steps = append(steps, starts[i].Sub(starts[i-1]).Seconds())
		}
		if len(steps) == 0 {
			return historyRound{}, fmt.Errorf("history (%s database): a run of %d merchants at B=%d made one step; raise --history-merchants", h.label, o.historyMerchants, historyBatch)
		}
		return historyRound{rate: historyBatch / median(steps), unit: "merchants/s", items: res.items, db: dbUsed}, nil
	case "delivery":
		db := r.dbCPU()
		start := time.Now()
		n, err := h.svc.Outbox.Drain(ctx, settlement.PayoutKind)
		elapsed := time.Since(start)
		dbUsed := db.used()
		if err != nil {
			return historyRound{}, fmt.Errorf("history (%s database): draining payouts: %w", h.label, err)
		}
		if n != o.historyMerchants {
			return historyRound{}, fmt.Errorf("history (%s database): delivered %d payouts, want the %d of the last run", h.label, n, o.historyMerchants)
		}
		return historyRound{rate: float64(n) / elapsed.Seconds(), unit: "payouts/s", items: n, db: dbUsed}, nil
	case "enqueue", "enqueue-random":
		// enqueue writes operations as the sample does: keys that start with a business date
		// after every date of the history, dated ids. enqueue-random writes what a caller of
		// OperationID with merchant-first keys does, as the history's operations of this kind
		// were written: each lands at a random position of the primary key (5M random ids)
		// and beside its merchant's older keys in the (kind, business_key) key. Enqueue writes
		// no request and no event; the delivery measure has those.
		date := h.rig.dates.take()
		ops := make([]outbox.EnqueueParams, historyEnqueueOps(o))
		for i := range ops {
			ops[i] = outbox.EnqueueParams{Kind: historyEnqKind, BusinessKey: fmt.Sprintf("%s/M%07d/%s", date.Format(time.DateOnly), i, tag),
				Payload: json.RawMessage(fmt.Sprintf(`{"settlement_id": %d, "merchant": "M%07d", "account": "EU00-%010d"}`, i, i, i)),
				Amount:  int64(100 + i), Currency: "EUR"}
			if m == "enqueue" {
				ops[i].ID = outbox.DatedOperationID(date, historyEnqKind, ops[i].BusinessKey)
			} else {
				ops[i].BusinessKey = fmt.Sprintf("M%07d/%s/%s", i, date.Format(time.DateOnly), tag)
			}
		}
		// A client's Local, as a step has: the kind is read from the registry once, not per
		// call. No River client: nothing is woken, the ledger's insert is what is measured.
		lctx := outbox.NewLocal().Context(ctx, nil)
		db := r.dbCPU()
		start := time.Now()
		for lo := 0; lo < len(ops); lo += historyBatch {
			if err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(lctx, tx, ops[lo:min(lo+historyBatch, len(ops))]...)
				return err
			}); err != nil {
				return historyRound{}, fmt.Errorf("history (%s database): enqueuing: %w", h.label, err)
			}
		}
		elapsed := time.Since(start)
		return historyRound{rate: float64(len(ops)) / elapsed.Seconds(), unit: "ops/s", items: len(ops), db: db.used()}, nil
	case "claim":
		var spent time.Duration
		db := r.dbCPU()
		for i := range historyClaims(o) {
			key := fmt.Sprintf("bench-claim/%s/%d/%d", tag, i, time.Now().UnixNano())
			start := time.Now()
			if err := checkpoint.Ensure(ctx, h.pool, key); err != nil {
				return historyRound{}, err
			}
			lease, err := h.store.Claim(ctx, key, "bench", 1)
			if err != nil {
				return historyRound{}, fmt.Errorf("history (%s database): %w", h.label, err)
			}
			if err := h.store.Release(ctx, lease); err != nil {
				return historyRound{}, fmt.Errorf("history (%s database): %w", h.label, err)
			}
			spent += time.Since(start)
		}
		return historyRound{rate: float64(historyClaims(o)) / spent.Seconds(), unit: "claims/s", items: historyClaims(o), db: db.used()}, nil
	}
	return historyRound{}, fmt.Errorf("history: unknown measure %q", m)
}

// stepSample is one Stepwise step of the settle loop: when it started and how long it took
// from its start to the next step's start (its statements, commit and next BEGIN).
type stepSample struct {
	at  time.Time
	dur time.Duration
}

// settleLoop runs Stepwise settle runs on h back to back until stop is closed, and returns
// the steps' samples (intervals within one run only: the gap between runs is seeding).
func (r *runner) settleLoop(ctx context.Context, h *historyDB, stop <-chan struct{}) ([]stepSample, error) {
	var out []stepSample
	for i := 0; ; i++ {
		select {
		case <-stop:
			return out, nil
		default:
		}
		date, err := h.rig.newDate(ctx, r.opts.historyMerchants)
		if err != nil {
			return out, err
		}
		h.rig.worker.record(true)
		m, err := h.rig.stepwiseRun(ctx, date, historyBatch, r.opts.historyMerchants, fmt.Sprintf("prune-%d", i))
		starts := h.rig.worker.record(false)
		if err != nil {
			return out, err
		}
		if err := h.verify(ctx, date, fmt.Sprintf("prune-%d", i), m.items); err != nil {
			return out, err
		}
		for k := 1; k < len(starts); k++ {
			out = append(out, stepSample{at: starts[k-1], dur: starts[k].Sub(starts[k-1])})
		}
	}
}

// historyPrune runs retention.Prune on the history database in windows beside a settle loop,
// each prune window paired with a quiet one (order alternating), until Prune has nothing left
// or --history-prune-for of pruning has passed.
func (r *runner) historyPrune(ctx context.Context, h *historyDB) error {
	o := r.opts
	if o.historyPruneFor == 0 {
		r.printf("retention.Prune beside a settle loop: not run (--history-prune-for 0)\n")
		return nil
	}
	var before int64
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE at < now() - $1::interval`, historyAge).Scan(&before); err != nil {
		return err
	}
	stop := make(chan struct{})
	var (
		samples []stepSample
		loopErr error
		ended   = make(chan struct{})
		once    sync.Once
	)
	go func() {
		defer close(ended)
		samples, loopErr = r.settleLoop(ctx, h, stop)
	}()
	stopLoop := func() error {
		once.Do(func() { close(stop) })
		<-ended
		return loopErr
	}
	// The loop's first run pays its date's seeding; let it reach its steps.
	time.Sleep(o.historyWindow)

	type window struct {
		from, to time.Time
		pruning  bool
		db       time.Duration // the server's CPU time in the window (negative: not measured)
	}
	var (
		windows []window
		total   retention.Result
		pruning time.Duration
		done    bool
		cfg     = &retention.Config{OlderThan: historyAge, BatchSize: o.historyPruneBatch}
		// Rows and prune time by phase: Prune does the runs (marking each and deleting
		// its events) first, then the operations' events, at different costs a row. A
		// window is counted to the phase that deleted more of its rows.
		phaseRows, phaseTime [2]float64
		recent               []float64 // rows/s of each prune window, for the progress lines
	)
	// One pass for the whole prune, held between two batches while a quiet window runs.
	pctx, cancelPass := context.WithCancel(ctx)
	defer cancelPass()
	pass := newPrunePass(pctx)
	cfg.Progress = pass.progress
	passEnded := make(chan struct{})
	var passRes *retention.Result
	var passErr error
	started := false
	startPass := func() {
		started = true
		go func() {
			defer close(passEnded)
			passRes, passErr = retention.Prune(pctx, h.pool, cfg)
			pass.end()
		}()
	}
	pruneFor := func(d time.Duration) {
		db := r.dbCPU()
		start := time.Now()
		from := pass.open()
		if !started {
			startPass()
		}
		select {
		case <-time.After(d):
		case <-passEnded:
		}
		to, end := pass.close()
		dbUsed := db.used()
		pruning += end.Sub(start)
		got := to.Total() - from.Total()
		ph := 0
		if to.OperationEvents-from.OperationEvents > (to.Runs-from.Runs)+(to.RunEvents-from.RunEvents) {
			ph = 1
		}
		phaseRows[ph] += float64(got)
		phaseTime[ph] += end.Sub(start).Seconds()
		recent = append(recent, float64(got)/end.Sub(start).Seconds())
		total = to
		windows = append(windows, window{start, end, true, dbUsed})
	}
	quietFor := func(d time.Duration) {
		db := r.dbCPU()
		start := time.Now()
		time.Sleep(d)
		end := time.Now()
		windows = append(windows, window{start, end, false, db.used()})
	}
	passDone := func() bool {
		select {
		case <-passEnded:
			return true
		default:
			return false
		}
	}
	began := time.Now()
windows:
	for pair := 0; !done && pruning < o.historyPruneFor; pair++ {
		select {
		case <-ended: // the settle loop failed: stopLoop reports why
			break windows
		default:
		}
		if pair%2 == 0 {
			quietFor(o.historyWindow)
			pruneFor(o.historyWindow)
		} else {
			pruneFor(o.historyWindow)
			quietFor(o.historyWindow)
		}
		if passDone() {
			if passErr != nil {
				_ = stopLoop()
				return fmt.Errorf("pruning: %w", passErr)
			}
			done = true // Prune returned on its own: nothing left
		}
		if pair%10 == 9 || done {
			last := recent[max(0, len(recent)-10):]
			r.progress("history: pruning, %d pairs of windows, %s rows pruned at %s rows/s, the last %d windows at %s rows/s (load %s)",
				pair+1, groupThousands(total.Total()), fmtRate(float64(total.Total())/pruning.Seconds()), len(last), fmtRate(mean(last)), loadAvg())
		}
	}
	// Stopped by the cap (or the settle loop): end the pass, held at a report, and keep what
	// it committed.
	cancelPass()
	if started {
		<-passEnded
		if passErr != nil && !errors.Is(passErr, context.Canceled) {
			_ = stopLoop()
			return fmt.Errorf("pruning: %w", passErr)
		}
		if passRes != nil {
			total = *passRes
		}
	}
	if err := stopLoop(); err != nil {
		return fmt.Errorf("the settle loop beside pruning: %w", err)
	}
	// Pair the windows (0,1), (2,3), ...: each pair holds one prune and one quiet window.
	meanIn := func(w window) (time.Duration, int) {
		var sum time.Duration
		n := 0
		for _, s := range samples {
			if !s.at.Before(w.from) && s.at.Before(w.to) {
				sum += s.dur
				n++
			}
		}
		if n == 0 {
			return 0, 0
		}
		return sum / time.Duration(n), n
	}
	var slow []float64
	var stepsQuiet, stepsPrune int
	for i := 0; i+1 < len(windows); i += 2 {
		a, b := windows[i], windows[i+1]
		if a.pruning {
			a, b = b, a
		}
		q, nq := meanIn(a)
		p, np := meanIn(b)
		// A prune window cut short by the end of pruning is too short to compare.
		if nq < 3 || np < 3 {
			continue
		}
		stepsQuiet += nq
		stepsPrune += np
		slow = append(slow, float64(p)/float64(q))
	}
	var left int64
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE at < now() - $1::interval`, historyAge).Scan(&left); err != nil {
		return err
	}
	batchSize := "500 (the default)"
	if o.historyPruneBatch > 0 {
		batchSize = fmt.Sprint(o.historyPruneBatch)
	}
	r.printf("retention.Prune (BatchSize %s, OlderThan %s) beside a settle loop (Stepwise runs of %d merchants, B=%d) on the history database:\n",
		batchSize, historyAge, o.historyMerchants, historyBatch)
	rate := 0.0
	if pruning > 0 {
		rate = float64(total.Total()) / pruning.Seconds()
	}
	r.printf("  %s rows in %s of prune windows (%s runs marked, %s run events and %s operation events deleted; %d batches, %d skipped): %s rows/s\n",
		groupThousands(total.Total()), fmtDur(pruning), groupThousands(total.Runs), groupThousands(total.RunEvents), groupThousands(total.OperationEvents),
		total.Batches, total.Skipped, fmtRate(rate))
	for ph, what := range []string{"runs (each marked, its events deleted)", "the operations' events"} {
		if phaseTime[ph] > 0 {
			r.printf("  %s: %s rows in %s of prune windows, %s rows/s\n", what, groupThousands(int64(phaseRows[ph])),
				fmtDur(time.Duration(phaseTime[ph]*float64(time.Second))), fmtRate(phaseRows[ph]/phaseTime[ph]))
		}
	}
	// The prune's own database CPU, by difference: the cores busy in prune windows less what
	// the settle loop and the rest kept busy there, estimated from the quiet windows scaled
	// by the steps' rate (the loop is slower while pruning, so it uses less CPU then). An
	// estimate: the checkpointer's writes of the pages a prune dirtied can fall in the next
	// window of either kind.
	var cpuIn, wallIn [2]time.Duration // [quiet, pruning]
	var stepsIn [2]int
	measured := true
	for _, w := range windows {
		if w.db < 0 {
			measured = false
			break
		}
		k := 0
		if w.pruning {
			k = 1
		}
		cpuIn[k] += w.db
		wallIn[k] += w.to.Sub(w.from)
		_, n := meanIn(w)
		stepsIn[k] += n
	}
	if measured && wallIn[0] > 0 && wallIn[1] > 0 && stepsIn[0] > 0 {
		quiet, busy := cpuIn[0].Seconds()/wallIn[0].Seconds(), cpuIn[1].Seconds()/wallIn[1].Seconds()
		stepRate := (float64(stepsIn[1]) / wallIn[1].Seconds()) / (float64(stepsIn[0]) / wallIn[0].Seconds())
		own := busy - quiet*stepRate
		perCore := "within the noise"
		if own > 0 {
			perCore = fmtRate(float64(total.Total())/(own*wallIn[1].Seconds())) + " rows per second of it (per db core)"
		}
		r.printf("  database cores busy: %.2f in prune windows, %.2f in quiet ones, the steps at %.2f of their quiet rate while pruning;\n"+
			"  the prune's own by difference: %+.2f cores, %s\n", busy, quiet, stepRate, own, perCore)
	}
	switch {
	case !done && total.Batches == 0:
		r.printf("  stopped after --history-prune-for %s: no batch committed (each outlasted its %s window); %s of %s old events left\n",
			o.historyPruneFor, o.historyWindow, groupThousands(left), groupThousands(before))
	case !done:
		r.printf("  stopped after --history-prune-for %s: %s of %s old events left (at this rate about %s more)\n",
			o.historyPruneFor, groupThousands(left), groupThousands(before), fmtDur(time.Duration(float64(left)/max(rate, 1)*float64(time.Second))))
	case total.Skipped > 100:
		r.printf("  stopped contended: %d batches gave up on a lock (the settle loop's rows), and Prune left the rest for the next pass; %s of %s old events left\n",
			total.Skipped, groupThousands(left), groupThousands(before))
	default:
		r.printf("  done: %s old events before, %s left (events younger than %s, and none but those are deleted)\n", groupThousands(before), groupThousands(left), historyAge)
	}
	if len(slow) == 0 {
		r.printf("  step slowdown: no pair of windows held enough steps (--history-window %s is too short for this machine)\n", o.historyWindow)
		r.check(false, "step slowdown while pruning <= 1.10: no pair of windows to compare")
		return nil
	}
	r.printf("  step slowdown while pruning (mean step with / without, per pair of %s windows): median %.2f [%.2f-%.2f] over %d pairs, %d steps quiet, %d pruning; %s in all\n",
		o.historyWindow, median(slow), slices.Min(slow), slices.Max(slow), len(slow), stepsQuiet, stepsPrune, fmtDur(time.Since(began)))
	r.check(median(slow) <= 1.10, "step slowdown while pruning <= 1.10: %s (%s rows/s pruned)", ratioAgainst(median(slow), 1.10), fmtRate(rate))
	return nil
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// prunePass holds one retention.Prune pass between two batches (through Config.Progress)
// while the gate is closed, so that every prune window continues the pass where the last one
// stopped, as a production pass runs from its start to its end. Guards against a measure of
// the bench's own making: a pass cut at each window's end and started anew in the next began
// at the oldest event, over the dead index entries of every event deleted before it (they
// stay until VACUUM, which does not run in the bench's minutes), so the rate fell as the
// prune went on.
type prunePass struct {
	ctx     context.Context
	mu      sync.Mutex
	cond    *sync.Cond // broadcast on every change below, and when ctx ends
	gate    bool       // batches may run
	opens   int        // how many times the gate opened: a waiter leaves on a change, however short the opening
	last    retention.Result
	reports int
	ended   bool
}

func newPrunePass(ctx context.Context) *prunePass {
	p := &prunePass{ctx: ctx}
	p.cond = sync.NewCond(&p.mu)
	context.AfterFunc(ctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cond.Broadcast()
	})
	return p
}

// progress is the pass's Config.Progress: it records the totals and, with the gate closed,
// waits for it to open (or the pass's ctx to end).
func (p *prunePass) progress(r retention.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last, p.reports = r, p.reports+1
	p.cond.Broadcast()
	// Guards against a lost wakeup: an open followed by a close before this waiter ran would
	// find the gate closed again, and the close would wait for a report that never came.
	for g := p.opens; !p.gate && p.opens == g && p.ctx.Err() == nil; {
		p.cond.Wait()
	}
}

// open lets batches run and returns the totals so far (exact: the pass is held, or not
// started).
func (p *prunePass) open() retention.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = true
	p.opens++
	p.cond.Broadcast()
	return p.last
}

// close stops batches and waits until the pass is held at its next report, or has ended: the
// batch under way when the window ran out (or the one after the pause under way) belongs to
// this window. It returns the totals then, and when.
func (p *prunePass) close() (retention.Result, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = false
	for n := p.reports; p.reports == n && !p.ended && p.ctx.Err() == nil; {
		p.cond.Wait()
	}
	return p.last, time.Now()
}

// end records that Prune returned.
func (p *prunePass) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended = true
	p.cond.Broadcast()
}
