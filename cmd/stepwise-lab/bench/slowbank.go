package bench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// The slowbank section delivers payouts to a fake bank that answers in tens or hundreds of
// milliseconds, as a real one does, at several outbox concurrencies in one process. The
// physical limit of a dispatcher is Concurrency / latency: no more sends can be in flight.
// Measured against that (and against the same concurrency's zero-latency rate, where this
// machine cannot reach the limit at all), the ratio says how much of the time the senders
// are waiting for the ledger instead of the bank.

// slowBankPool is the pool of the slowbank and bigday sections: Drain's pump uses at most
// three connections at once (the claim, the recorder, the lease renewer; no River job, so no
// heartbeat), a reconcile pass one at a time. Senders hold none.
const slowBankPool = 8

// slowBankTargetRate is the rate up to which a process must reach 0.90 of its limit.
const slowBankTargetRate = 5000

// slowBank starts a fake bank that answers after latency (payments ±10%, uniform, with
// jitter; lookups after latency less 10% then), and a keep-alive client with a connection per concurrent call.
func slowBank(latency time.Duration, jitter bool, conns int) (*fakebank.Bank, *fakebank.Client, func(), error) {
	cfg := &fakebank.Config{Latency: latency}
	if latency > 0 && jitter {
		j := latency / 10
		cfg.Latency = latency - j
		cfg.Profile = fakebank.LatencyProfile{Slow: 1, SlowMin: 0, SlowMax: 2 * j}
	}
	bank := fakebank.New(cfg)
	if err := bank.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("starting the fake bank: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// One idle connection kept per concurrent call: with fewer, every call beyond them opens
	// (and closes) a TCP connection, and at thousands per second the closed ones exhaust the
	// ephemeral ports in TIME_WAIT.
	tr.MaxIdleConns = conns
	tr.MaxIdleConnsPerHost = conns
	client := fakebank.NewClient(bank.URL(), &http.Client{Timeout: 5 * time.Second, Transport: tr})
	return bank, client, func() { tr.CloseIdleConnections(); _ = bank.Close() }, nil
}

// payoutOutbox is the sample's payout delivery (fakebank.Sender, OnPayoutOutcomes, the
// sample's 5s send timeout and 1m lease) at the given concurrency and batch size.
func payoutOutbox(pool *pgxpool.Pool, client *fakebank.Client, concurrency, batch int) (*outbox.Outbox, error) {
	return outbox.New(pool, &outbox.Config{
		ID:     "bench",
		Logger: quietLogger(),
		Kinds: map[string]*outbox.KindConfig{
			settlement.PayoutKind: {
				Sender:         &fakebank.Sender{Client: client},
				OnOutcomeBatch: settlement.OnPayoutOutcomes,
				Concurrency:    concurrency,
				BatchSize:      batch,
				Timeout:        5 * time.Second,
				Lease:          time.Minute,
			},
		},
	})
}

// seedPayouts writes n settlements of date and their payouts, set-based (one statement):
// every unknownEvery-th payout (all when 1) PENDING, the others SUCCEEDED with their
// settlement PAID, as a day looks once the dispatcher is through. It returns how many are
// PENDING.
func seedPayouts(ctx context.Context, pool *pgxpool.Pool, date time.Time, n, pendingEvery int) (int, error) {
	tag, err := pool.Exec(ctx, `
		WITH s AS (
			INSERT INTO settlement (merchant_id, settle_date, type, currency, amount, txn_count, run_key, status)
			SELECT g, $1::date, 'pos', 'EUR', 100 + (g * 7919) % 99900, 5, 'bench/' || $1::date,
				CASE WHEN g % $3 = 0 THEN 'PENDING' ELSE 'PAID' END
			FROM generate_series(1, $2::bigint) g
			RETURNING id, merchant_id, amount, status, run_key
		), p AS (
			-- A day's payouts are sent over the day: the SUCCEEDED ones' send times spread
			-- over the 24 hours before the seed, so a totals period can hold part of the day.
			SELECT s.*, m.code, now() - interval '1 day' + s.merchant_id * (interval '1 day' / $2::bigint) AS sent,
				jsonb_build_object('settlement_id', s.id, 'merchant', m.code,
					'account', 'EU' || lpad((s.merchant_id % 97)::text, 2, '0') || '-' || lpad(s.merchant_id::text, 10, '0')) AS payload
			-- settlement.MerchantCode: "M" and at least six digits (lpad alone would cut a
			-- seventh and make two merchants one).
			FROM s CROSS JOIN LATERAL (SELECT 'M' || lpad(s.merchant_id::text, greatest(6, length(s.merchant_id::text)), '0') AS code) m
		)
		INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, amount, currency, run_key,
			state, attempts, claims, last_sent_at, claimed_at, external_ref, finished_at)
		-- Ids laid out as the sample's payouts' (settlement.PayoutID, a DatedOperationID),
		-- not their values: the date's midnight in milliseconds, version 8, then an md5 of
		-- kind, date and merchant code with a fixed variant digit. A day's ids share their
		-- first twelve hex digits, which a comparison of the day's totals must not depend on.
		SELECT (lpad(to_hex((extract(epoch FROM $1::date) * 1000)::bigint), 12, '0') || '8' || substr(h, 14, 3) || '9' || substr(h, 18, 15))::uuid,
			$4, $1::date || '/' || code || '/pos/EUR', payload,
			sha256(convert_to(payload::text, 'UTF8')), amount, 'EUR', run_key,
			CASE WHEN status = 'PENDING' THEN 'PENDING' ELSE 'SUCCEEDED' END,
			CASE WHEN status = 'PENDING' THEN 0 ELSE 1 END,
			CASE WHEN status = 'PENDING' THEN 0 ELSE 1 END,
			CASE WHEN status = 'PENDING' THEN NULL ELSE sent END,
			CASE WHEN status = 'PENDING' THEN NULL ELSE sent - interval '5 ms' END,
			CASE WHEN status = 'PENDING' THEN NULL ELSE 'seed-' || id END,
			CASE WHEN status = 'PENDING' THEN NULL ELSE sent + interval '50 ms' END
		FROM p CROSS JOIN LATERAL (SELECT md5($4 || '/' || $1::date || '/' || p.code) AS h) k`, date, n, pendingEvery, settlement.PayoutKind)
	if err != nil {
		return 0, fmt.Errorf("seeding %d payouts of %s: %w", n, date.Format(time.DateOnly), err)
	}
	if tag.RowsAffected() != int64(n) {
		return 0, fmt.Errorf("seeding payouts of %s: wrote %d, want %d", date.Format(time.DateOnly), tag.RowsAffected(), n)
	}
	// Planned with real statistics, as a day's tables are by the time it is delivered.
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) settlement, stepwise_operation`); err != nil {
		return 0, fmt.Errorf("vacuuming after seeding payouts: %w", err)
	}
	return n / pendingEvery, nil
}

// drainResult is one timed drain.
type drainResult struct {
	n       int
	elapsed time.Duration
	rtt     time.Duration // mean send, Send called to returned, from the request rows
	db      dbUse
	cpu     time.Duration
	dbCPU   time.Duration // the database server's (negative: not measured)
	load    string
}

// dbUse sums up the statements a pool sent during a measurement.
type dbUse struct {
	stmts     int           // every statement, BEGIN and COMMIT included
	txs       int           // COMMITs: recording transactions (the claim is a statement of its own)
	claims    int           // claim statements
	claimWait time.Duration // client-side wait for the claims
	wait      time.Duration // client-side wait for all statements
}

func dbUseOf(stats map[string]*stmtStat) dbUse {
	var u dbUse
	for label, st := range stats {
		u.stmts += st.n
		u.wait += st.total
		switch {
		case strings.EqualFold(label, "commit"):
			u.txs += st.n
		case strings.HasPrefix(label, "WITH c AS ( SELECT operation_id, state FROM stepwise_operation"),
			strings.HasPrefix(label, "WITH c AS ( SELECT operation_id FROM stepwise_operation WHERE kind = $1 AND state = 'U"):
			// The outbox's claim, or the reconciler's.
			u.claims += st.n
			u.claimWait += st.total
		}
	}
	return u
}

func (d drainResult) rate() float64 { return float64(d.n) / d.elapsed.Seconds() }

// timedDrain seeds n PENDING payouts of a fresh date and drains them through ob, counting
// statements, this process's CPU time and the server's (srv, when not nil), and checks that
// every one SUCCEEDED.
func timedDrain(ctx context.Context, pool *pgxpool.Pool, tracer *statementTracer, srv *serverCPU, ob *outbox.Outbox, dates *dateSeq, n int) (drainResult, error) {
	date := dates.take()
	if _, err := seedPayouts(ctx, pool, date, n, 1); err != nil {
		return drainResult{}, err
	}
	tracer.reset()
	db := srv.meter() // first, so that its reading of /proc is not this process's work
	cpu0 := cpuTime()
	start := time.Now()
	got, err := ob.Drain(ctx, settlement.PayoutKind)
	res := drainResult{n: n, elapsed: time.Since(start), db: dbUseOf(tracer.reset()), cpu: cpuTime() - cpu0, dbCPU: db.used(), load: loadAvg()}
	if err != nil {
		return res, fmt.Errorf("draining %d payouts: %w", n, err)
	}
	if got != n {
		return res, fmt.Errorf("drained %d payouts, want %d", got, n)
	}
	var ok int
	var rttSec float64
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(avg(extract(epoch FROM q.ended_at - q.started_at)), 0)::float8
		FROM stepwise_operation o JOIN settlement s ON s.id = (o.payload->>'settlement_id')::bigint
		LEFT JOIN stepwise_operation_request q ON q.operation_id = o.operation_id AND q.claim = o.claims
		WHERE o.run_key = $1 AND o.state = 'SUCCEEDED' AND s.status = 'PAID'`, "bench/"+date.Format(time.DateOnly)).Scan(&ok, &rttSec); err != nil {
		return res, fmt.Errorf("counting delivered payouts: %w", err)
	}
	res.rtt = time.Duration(rttSec * float64(time.Second))
	if ok != n {
		// Say what the others became: a send that timed out on a loaded machine ends
		// UNKNOWN_EXTERNAL, a lost outcome would leave PROCESSING.
		var found []string
		rows, qerr := pool.Query(ctx, `SELECT o.state || '/' || s.status || ': ' || count(*)
			FROM stepwise_operation o JOIN settlement s ON s.id = (o.payload->>'settlement_id')::bigint
			WHERE o.run_key = $1 GROUP BY o.state, s.status ORDER BY 1`, "bench/"+date.Format(time.DateOnly))
		if qerr == nil {
			found, qerr = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if qerr != nil {
			found = []string{"(not read: " + qerr.Error() + ")"}
		}
		return res, fmt.Errorf("after the drain %d payouts SUCCEEDED with their settlement PAID, want %d (payout state/settlement status: %s)",
			ok, n, strings.Join(found, ", "))
	}
	return res, nil
}

func (r *runner) slowbankSection(ctx context.Context) error {
	o := r.opts.bank
	rss := newRSSWatch()
	dbURL, err := r.clone(ctx, "slowbank")
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
	dates := newDateSeq()
	batch := o.batch
	if batch == 0 {
		batch = outbox.BatchSizeDefault
	}

	drainAt := func(lat time.Duration, c, n int) (drainResult, error) {
		_, client, stop, err := slowBank(lat, lat > 0, c)
		if err != nil {
			return drainResult{}, err
		}
		defer stop()
		ob, err := payoutOutbox(pool, client, c, o.batch)
		if err != nil {
			return drainResult{}, err
		}
		return timedDrain(ctx, pool, tracer, r.serverCPU, ob, dates, n)
	}

	type row struct {
		latency time.Duration
		c       int
		ideal   float64     // Concurrency / latency
		zero    drainResult // the same concurrency at zero latency, run just before
		after   drainResult // and again just after
		d       drainResult
	}
	// limitOf is a row's limit: Concurrency / latency, or the mean of the zero-latency rates
	// around it where that is lower (marked "*").
	limitOf := func(x row) (float64, string) {
		if z := (x.zero.rate() + x.after.rate()) / 2; z < x.ideal {
			return z, "*"
		}
		return x.ideal, ""
	}
	var rows []row
	for _, lat := range o.latencies {
		for _, c := range o.concurrency {
			// The zero-latency rate at this concurrency, measured just before the slow bank's
			// and again just after, so that the two bracket the load it met from the rest of
			// the machine: what this process and database can do at all. Where their mean is
			// below Concurrency / latency, it is the limit.
			//
			// A reference that can decide the limit lasts as long as the measurement. Measured
			// only before, a second of zero latency against 8 s of the slow bank, the rows at
			// that limit read 0.83-1.11 from run to run; bracketed by two such seconds they
			// still read up to 1.08, because a second-long drain carries its start-up (a new
			// bank client's connections, the first claim) against an 8 s measurement's one.
			// So a short probe comes first: where its rate is within twice Concurrency /
			// latency, the references are drains of the probe's rate × the window.
			probeN := max(c, int(math.Round(5000*o.window.Seconds()/8)))
			probe, err := drainAt(0, c, probeN)
			if err != nil {
				return fmt.Errorf("zero latency, concurrency %d: %w", c, err)
			}
			ideal := float64(c) / lat.Seconds()
			zeroN, zero := probeN, probe
			if probe.rate() < 2*ideal {
				zeroN = max(probeN, int(math.Round(probe.rate()*o.window.Seconds())))
				if zero, err = drainAt(0, c, zeroN); err != nil {
					return fmt.Errorf("zero latency, concurrency %d: %w", c, err)
				}
			}
			limit := min(ideal, zero.rate())
			// Enough payouts to keep the senders busy for the window, in whole rounds of
			// Concurrency, so that the limit is exactly Concurrency / latency.
			n := max(2, int(math.Round(limit*o.window.Seconds()/float64(c)))) * c
			d, err := drainAt(lat, c, n)
			if err != nil {
				return fmt.Errorf("latency %s, concurrency %d: %w", lat, c, err)
			}
			after, err := drainAt(0, c, zeroN)
			if err != nil {
				return fmt.Errorf("zero latency after, concurrency %d: %w", c, err)
			}
			x := row{latency: lat, c: c, ideal: ideal, zero: zero, after: after, d: d}
			rows = append(rows, x)
			limit, _ = limitOf(x)
			// The probe's own rate, and whether it served as the reference (it does where it
			// was at least twice Concurrency / latency: then that is the limit anyway).
			probeUse := "the references ran the probe's rate × the window"
			if zeroN == probeN && probe.rate() >= 2*ideal {
				probeUse = "at least twice Concurrency / latency, so it served as the reference before"
			}
			r.progress("slowbank: latency %s, concurrency %d: %s payouts/s of a limit of %s (%.2f; %d payouts in %s; zero latency %s/s before, %s/s after; probe %s/s over %d payouts, %s; load %s)",
				lat, c, fmtRate(d.rate()), fmtRate(limit), d.rate()/limit, n, fmtDur(d.elapsed), fmtRate(zero.rate()), fmtRate(after.rate()),
				fmtRate(probe.rate()), probeN, probeUse, d.load)
		}
	}

	r.printf("\n== slowbank: payouts delivered to a fake bank answering in 50-500ms (±10%%), one process, outbox BatchSize %d, pool %d ==\n", batch, slowBankPool)
	r.printf("limit = Concurrency / latency (no more sends can be in flight), or the zero-latency rate where that is lower (*): the mean\n" +
		"of the rows \"0\" around it, run just before and just after\n")
	r.printf("%-8s %5s %7s %10s %9s %6s %8s %6s %8s %9s %7s %6s %6s %8s %5s %8s %8s %5s %5s\n",
		"latency", "conc", "payouts", "payouts/s", "limit", "ratio", "rtt", "busy", "stmts/op", "ops/claim", "ops/tx", "claim", "record", "cpu/op", "cpu%",
		"db/op", "/db core", "db", "load")
	line := func(lat string, c int, d drainResult, limit string, ratio string) {
		r.printf("%-8s %5d %7d %10s %9s %6s %8s %5.0f%% %8.2f %9.0f %7.0f %5.0f%% %5.0f%% %8s %4.0f%% %8s %8s %5s %5s\n", lat, c, d.n, fmtRate(d.rate()), limit, ratio,
			fmtDur(d.rtt), 100*d.rate()*d.rtt.Seconds()/float64(c),
			float64(d.db.stmts)/float64(d.n), float64(d.n)/float64(max(d.db.claims, 1)), float64(d.n)/float64(max(d.db.txs, 1)),
			100*d.db.claimWait.Seconds()/d.elapsed.Seconds(), 100*(d.db.wait-d.db.claimWait).Seconds()/d.elapsed.Seconds(),
			fmtDur(d.cpu/time.Duration(d.n)), 100*d.cpu.Seconds()/d.elapsed.Seconds()/float64(runtime.NumCPU()),
			fmtCPUPer(d.dbCPU, d.n), fmtPerCore(d.n, d.dbCPU), fmtCores(d.dbCPU, d.elapsed), d.load)
	}
	for _, x := range rows {
		line("0", x.c, x.zero, "-", "-")
		limit, mark := limitOf(x)
		ratio := x.d.rate() / limit
		line(x.latency.String(), x.c, x.d, fmtRate(limit)+mark, fmt.Sprintf("%.2f", ratio))
		line("0", x.c, x.after, "-", "-")
		// The target is 0.90 of the limit up to 5,000 payouts/s a process: a row whose limit
		// is higher must still deliver 4,500/s.
		if limit <= slowBankTargetRate {
			r.check(ratio >= 0.90, "slowbank >= 0.90 of the limit at latency %s, concurrency %d: %s of %s/s", x.latency, x.c, ratioAgainst(ratio, 0.90), fmtRate(limit))
		} else {
			got := x.d.rate() / slowBankTargetRate
			r.check(got >= 0.90, "slowbank >= 0.90 of %s/s at latency %s, concurrency %d (limit %s/s): %s", fmtRate(slowBankTargetRate), x.latency, x.c, fmtRate(limit), ratioAgainst(got, 0.90))
		}
	}
	r.printf("rtt: mean send (Send called to returned, from the request rows): the bank's latency plus HTTP and this machine's scheduling;\n" +
		"busy: payouts/s × rtt / Concurrency, the share of the time the senders had a payout in flight. ratio falls below busy by\n" +
		"what the round trip adds to the bank's latency, which a loaded machine inflates and the outbox does not control\n")
	r.printf("stmts/op: statements sent per payout (BEGIN and COMMIT included); ops/claim: payouts per claim statement; ops/tx: payouts per\n" +
		"recording transaction; claim, record: share of the wall time a claim, or a recording statement (and lease renewals), was\n" +
		"waited for (the recorder is one goroutine: near 100%% it is the bottleneck)\n")
	r.printf("cpu/op, cpu%%: this process's CPU time (outbox, the fake bank's HTTP server and both ends of every connection) per payout and as a share of the %d CPUs; PostgreSQL's is not included\n", runtime.NumCPU())
	r.printf("db/op, /db core, db: the database server's CPU time per payout, payouts per second of it, and the cores it kept busy (\"-\": not measured)\n")
	r.printf("slowbank peak RSS: %s\n", rss.peak())
	return nil
}
