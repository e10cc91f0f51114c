package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/workflow"
)

// scaleBatch is the settle batch of the scale section.
const scaleBatch = 100

func (r *runner) scaleSection(ctx context.Context) error {
	o := r.opts
	bank, _, stopBank, err := startBank()
	if err != nil {
		return err
	}
	defer stopBank()
	plan, err := settlement.Plan{Shards: o.scaleShards}.Compile()
	if err != nil {
		return err
	}
	dates := newDateSeq()
	type row struct {
		procs   int
		elapsed time.Duration
		payouts int
		settled int
		db      time.Duration // the database server's CPU time over the run (negative: not measured)
	}
	var rows []row
	for _, n := range o.scaleProcs {
		// A database per row: the previous row's payouts, still being delivered, must not
		// be this row's load.
		pool, dbURL, err := r.sectionDB(ctx, fmt.Sprintf("scale%d", n))
		if err != nil {
			return err
		}
		defer pool.Close()
		inserter, err := insertClient(pool)
		if err != nil {
			return err
		}
		wo := workerOpts{dbURL: dbURL, bankURL: bank.URL(), lease: 30 * time.Second, batch: scaleBatch, slots: o.scaleShards, maintenance: "every"}
		var procs []*workerProc
		for range n {
			p, err := startWorker(ctx, wo)
			if err != nil {
				for _, q := range procs {
					q.kill()
				}
				return err
			}
			procs = append(procs, p)
		}
		res, err := func() (row, error) {
			defer func() {
				for _, p := range procs {
					p.stop()
				}
			}()
			date := dates.take()
			if err := seedDate(ctx, pool, date, o.scaleItems); err != nil {
				return row{}, err
			}
			db := r.dbCPU()
			start := time.Now()
			keys, err := startDate(ctx, pool, inserter, plan, date, 0)
			if err != nil {
				return row{}, err
			}
			deadline := start.Add(runTimeout(o.scaleItems))
			for {
				var done int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_run WHERE key = ANY($1) AND status = $2`,
					keys, workflow.RunStatusSucceeded).Scan(&done); err != nil {
					return row{}, err
				}
				if done == len(keys) {
					break
				}
				if time.Now().After(deadline) {
					return row{}, fmt.Errorf("%d of %d runs of %s finished after %s", done, len(keys), date.Format(time.DateOnly), runTimeout(o.scaleItems))
				}
				time.Sleep(10 * time.Millisecond)
			}
			elapsed := time.Since(start)
			res := row{procs: n, elapsed: elapsed, db: db.used()}
			if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM settlement WHERE settle_date = $1),
				(SELECT count(*) FROM stepwise_operation WHERE state = 'SUCCEEDED' AND business_key LIKE $2 || '/%')`,
				date, date.Format(time.DateOnly)).Scan(&res.settled, &res.payouts); err != nil {
				return row{}, err
			}
			if res.settled != o.scaleItems {
				return row{}, fmt.Errorf("%d processes settled %d merchants of %s, want %d", n, res.settled, date.Format(time.DateOnly), o.scaleItems)
			}
			return res, nil
		}()
		if err != nil {
			return err
		}
		rows = append(rows, res)
		r.log.Info("scale", "procs", n, "elapsed", res.elapsed)
	}
	r.printf("\n== scale: %d merchants in %d shards (runs), B=%d, worker processes each the sample's Service (payout delivery runs beside, as in serve) ==\n",
		o.scaleItems, o.scaleShards, scaleBatch)
	r.printf("%-10s %12s %10s %22s %10s %6s\n", "processes", "merchants/s", "time", "payouts paid meanwhile", "/db core", "db")
	for _, x := range rows {
		r.printf("%-10d %12s %10s %22d %10s %6s\n", x.procs, fmtRate(float64(x.settled)/x.elapsed.Seconds()), fmtDur(x.elapsed), x.payouts,
			fmtPerCore(x.settled, x.db), fmtCores(x.db, x.elapsed))
	}
	r.printf("/db core, db: merchants settled per second of the database server's CPU time (the payouts delivered meanwhile included), and\n" +
		"the cores it kept busy (\"-\": not measured)\n")
	return nil
}
