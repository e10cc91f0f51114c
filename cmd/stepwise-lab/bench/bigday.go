package bench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// The bigday section reconciles a big merchant acquirer's day: a million payouts of one date
// (seeded set-based), 2% of them UNKNOWN_EXTERNAL (applied by the bank, their answer lost),
// looked up at a bank that answers in 100ms. A pass's physical limit is the reconciler's
// Concurrency / latency.

// unknownDrainConcurrency is the outbox concurrency that sends the big day's doomed payouts
// into the bank's 5xx (not measured: it only makes them UNKNOWN_EXTERNAL).
const unknownDrainConcurrency = 1024

func (r *runner) bigdaySection(ctx context.Context) error {
	o := r.opts.bank
	rss := newRSSWatch()
	dbURL, err := r.clone(ctx, "bigday")
	if err != nil {
		return err
	}
	tracer := newStatementTracer()
	pool, err := newTracedPool(ctx, dbURL, slowBankPool, tracer)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := settlement.RegisterPayoutKind(ctx, pool); err != nil {
		return err
	}

	// The day: n payouts, every pendingEvery-th left PENDING, the others SUCCEEDED.
	n := o.bigdayOps
	pendingEvery := max(1, int(math.Round(1/o.bigdayUnk)))
	date := newDateSeq().take()
	r.progress("bigday: seeding %d payouts of %s (1 in %d to become UNKNOWN_EXTERNAL)...", n, date.Format(time.DateOnly), pendingEvery)
	t := time.Now()
	unknown, err := seedPayouts(ctx, pool, date, n, pendingEvery)
	if err != nil {
		return err
	}
	seeded := time.Since(t)
	r.progress("bigday: seeded in %s (load %s)", fmtDur(seeded), loadAvg())

	conns := unknownDrainConcurrency
	for _, c := range o.bigdayConc {
		conns = max(conns, c)
	}
	bank, client, stop, err := slowBank(o.bigdayLat, false, conns)
	if err != nil {
		return err
	}
	defer stop()
	ob, err := payoutOutbox(pool, client, unknownDrainConcurrency, 0)
	if err != nil {
		return err
	}
	// The bank applies each payment and answers 5xx: every one ends UNKNOWN_EXTERNAL, and
	// the bank holds the effect the reconciler must find.
	if err := bank.SetFaults(fakebank.Mix{Error5xxAfterApply: 1}); err != nil {
		return err
	}
	t = time.Now()
	if _, err := ob.Drain(ctx, settlement.PayoutKind); err != nil {
		return fmt.Errorf("sending the big day's payouts into the 5xx: %w", err)
	}
	if err := bank.SetFaults(fakebank.Mix{}); err != nil {
		return err
	}
	// Nothing is due until the measurements make it so: each takes its own share.
	tag, err := pool.Exec(ctx, `UPDATE stepwise_operation SET next_check_at = now() + interval '1 day'
		WHERE kind = $1 AND state = 'UNKNOWN_EXTERNAL'`, settlement.PayoutKind)
	if err != nil {
		return fmt.Errorf("parking the unknown payouts: %w", err)
	}
	if int(tag.RowsAffected()) != unknown {
		return fmt.Errorf("%d payouts UNKNOWN_EXTERNAL after the 5xx drain, want %d", tag.RowsAffected(), unknown)
	}
	r.progress("bigday: %d payouts UNKNOWN_EXTERNAL (sent into the 5xx in %s)", unknown, fmtDur(time.Since(t)))
	// The seeding's pages written out now, so that the checkpointer writing a million
	// payouts is not counted as the first pass's database CPU (or its time). Best effort, as
	// in the history and size sections.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		r.progress("bigday: CHECKPOINT refused (%v): the seeding's pages may be written during the first pass", err)
	}

	type row struct {
		c, batch int
		k        int
		elapsed  time.Duration
		db       dbUse
		cpu      time.Duration
		dbCPU    time.Duration
		load     string
	}
	var rows []row
	type config struct{ c, batch int }
	var configs []config
	largest := 0
	// Each Concurrency with BatchSize unset, as a user leaves it; then the largest once more,
	// with the smallest batch (BatchSizeDefault), reconciling the rest of the day: a pass
	// streams claims, lookups and recording, so a batch smaller than Concurrency no longer
	// caps the lookups in flight (it did, when a pass looked up and recorded one batch before
	// claiming the next).
	for _, c := range o.bigdayConc {
		configs = append(configs, config{c, 0})
		largest = max(largest, c)
	}
	configs = append(configs, config{largest, reconcile.BatchSizeDefault})
	remaining := unknown
	for i, cf := range configs {
		// Each measurement takes its window's worth, leaving a share for those after it; the
		// last reconciles the rest of the day.
		k := min(remaining/(len(configs)-i), max(2*cf.c, int(math.Round(float64(cf.c)/o.bigdayLat.Seconds()*o.bigdayWindow.Seconds()))))
		if i == len(configs)-1 {
			k = remaining
		}
		if k == 0 {
			continue
		}
		if _, err := pool.Exec(ctx, `UPDATE stepwise_operation SET next_check_at = now() - interval '1 second'
			WHERE operation_id IN (SELECT operation_id FROM stepwise_operation
				WHERE kind = $1 AND state = 'UNKNOWN_EXTERNAL' AND next_check_at > now() ORDER BY operation_id LIMIT $2)`,
			settlement.PayoutKind, k); err != nil {
			return fmt.Errorf("making %d unknown payouts due: %w", k, err)
		}
		rcfg := (&reconcile.Config{
			Outbox: ob,
			Logger: quietLogger(),
			Kinds: map[string]*reconcile.KindConfig{
				settlement.PayoutKind: {
					Checker:     fakebank.Checker{Client: client},
					Concurrency: cf.c,
					BatchSize:   cf.batch,
					Timeout:     5 * time.Second,
					Grace:       time.Minute,
				},
			},
		}).WithDefaults()
		cf.batch = rcfg.Kinds[settlement.PayoutKind].BatchSize // the row prints what the pass used
		rec, err := reconcile.New(pool, rcfg)
		if err != nil {
			return err
		}
		tracer.reset()
		db := r.dbCPU() // first, so that its reading of /proc is not this process's work
		cpu0 := cpuTime()
		start := time.Now()
		res, err := rec.RunOnce(ctx, &reconcile.RunOpts{Kind: settlement.PayoutKind})
		x := row{c: cf.c, batch: cf.batch, k: k, elapsed: time.Since(start), db: dbUseOf(tracer.reset()), cpu: cpuTime() - cpu0, dbCPU: db.used(), load: loadAvg()}
		if err != nil {
			return fmt.Errorf("reconciling %d payouts at concurrency %d: %w", k, cf.c, err)
		}
		if res.Checked != k || res.Moved[outbox.StateSucceeded] != k {
			return fmt.Errorf("reconcile pass at concurrency %d checked %d and moved %d to SUCCEEDED, want %d each (lookups %v)",
				cf.c, res.Checked, res.Moved[outbox.StateSucceeded], k, res.Lookups)
		}
		remaining -= k
		rows = append(rows, x)
		limit := float64(cf.c) / o.bigdayLat.Seconds()
		rate := float64(k) / x.elapsed.Seconds()
		r.progress("bigday: concurrency %d, batch %d: %s lookups/s of a limit of %s (%.2f; %d lookups in %s, load %s)",
			cf.c, cf.batch, fmtRate(rate), fmtRate(limit), rate/limit, k, fmtDur(x.elapsed), x.load)
	}
	var paid, left int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM settlement WHERE settle_date = $1 AND status = 'PAID'),
		(SELECT count(*) FROM stepwise_operation WHERE kind = $2 AND state <> 'SUCCEEDED')`, date, settlement.PayoutKind).Scan(&paid, &left); err != nil {
		return fmt.Errorf("counting the big day's outcome: %w", err)
	}
	if paid != n || left != 0 {
		return fmt.Errorf("after reconciling the big day: %d of %d settlements PAID, %d payouts not SUCCEEDED", paid, n, left)
	}

	r.printf("\n== bigday: reconciling one date of %s payouts, %d UNKNOWN_EXTERNAL, at a bank answering lookups in %s ==\n",
		groupThousands(int64(n)), unknown, o.bigdayLat)
	r.printf("seeded set-based in %s; limit = Concurrency / latency; each row is one reconcile pass over that many due payouts\n", fmtDur(seeded))
	r.printf("%5s %6s %8s %10s %8s %6s %8s %9s %6s %6s %8s %5s %8s %8s %5s %5s\n", "conc", "batch", "lookups", "lookups/s", "limit", "ratio",
		"stmts/op", "ops/claim", "claim", "record", "cpu/op", "cpu%", "db/op", "/db core", "db", "load")
	for _, x := range rows {
		limit := float64(x.c) / o.bigdayLat.Seconds()
		rate := float64(x.k) / x.elapsed.Seconds()
		r.printf("%5d %6d %8d %10s %8s %6.2f %8.2f %9.0f %5.0f%% %5.0f%% %8s %4.0f%% %8s %8s %5s %5s\n", x.c, x.batch, x.k, fmtRate(rate), fmtRate(limit), rate/limit,
			float64(x.db.stmts)/float64(x.k), float64(x.k)/float64(max(x.db.claims, 1)),
			100*x.db.claimWait.Seconds()/x.elapsed.Seconds(), 100*(x.db.wait-x.db.claimWait).Seconds()/x.elapsed.Seconds(),
			fmtDur(x.cpu/time.Duration(x.k)), 100*x.cpu.Seconds()/x.elapsed.Seconds()/float64(runtime.NumCPU()),
			fmtCPUPer(x.dbCPU, x.k), fmtPerCore(x.k, x.dbCPU), fmtCores(x.dbCPU, x.elapsed), x.load)
	}
	r.printf("a pass claims BatchSize at a time while the last batch is looked up (Concurrency at once) and records decisions as they\n" +
		"arrive; an unset BatchSize is 4 × Concurrency (at least 100), the last row sets the smallest; claim and record are the\n" +
		"shares of the pass's time its claims and recording transactions took (they overlap the lookups); db/op, /db core, db: the\n" +
		"database server's CPU time per lookup, lookups per second of it, and the cores it kept busy (\"-\": not measured)\n")
	// The reconciler's peak, before the totals hold the day's statement (twice: the one read
	// and the copy handed to each comparison).
	r.printf("bigday peak RSS before the totals: %s\n", rss.peak())
	// The day's totals, now that every payout of it is SUCCEEDED.
	if err := r.bigDayTotals(ctx, pool); err != nil {
		return err
	}
	r.printf("bigday peak RSS: %s\n", rss.peak())
	return nil
}
