package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// takeoverBatch is the settle batch of the takeover section: small steps, so that a kill
// lands mid-run and the successor's first commit comes right after its claim.
const takeoverBatch = 5

// insertClient is a River client that only inserts (the bench starts runs; workers work them).
func insertClient(pool *pgxpool.Pool) (*river.Client[pgx.Tx], error) {
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
	if err != nil {
		return nil, fmt.Errorf("creating an insert-only River client: %w", err)
	}
	return c, nil
}

// startDate seeds date for n merchants (none when n is 0: seeded already) and starts its
// runs with plan, as "sample-settlement settle" does.
func startDate(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], plan settlement.Plan, date time.Time, n int) ([]string, error) {
	if n > 0 {
		if err := seedDate(ctx, pool, date, n); err != nil {
			return nil, err
		}
	}
	var keys []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		runs, _, err := plan.Start(ctx, client, tx, date, "bench")
		for _, r := range runs {
			keys = append(keys, r.Key)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("starting the runs of %s: %w", date.Format(time.DateOnly), err)
	}
	return keys, nil
}

type checkpointRow struct {
	owner     *string
	token     int64
	steps     int64
	cursor    int64
	leaseLive bool
	runStatus string
}

func readCheckpoint(ctx context.Context, pool *pgxpool.Pool, key string) (checkpointRow, error) {
	var c checkpointRow
	err := pool.QueryRow(ctx, `SELECT c.owner, c.fencing_token, c.steps, coalesce((c.cursor->>'after_merchant')::bigint, 0),
			coalesce(c.lease_until > now(), false), r.status
		FROM stepwise_checkpoint c JOIN stepwise_run r ON r.key = c.key WHERE c.key = $1`, key).
		Scan(&c.owner, &c.token, &c.steps, &c.cursor, &c.leaseLive, &c.runStatus)
	if err != nil {
		return c, fmt.Errorf("reading checkpoint %s: %w", key, err)
	}
	return c, nil
}

// ownerPid is the pid of the worker process named in a lease owner
// ("bench-worker-<pid>/job-N/attempt-M").
func ownerPid(owner string) (int, bool) {
	client, _, _ := strings.Cut(owner, "/")
	pid, err := strconv.Atoi(strings.TrimPrefix(client, "bench-worker-"))
	return pid, err == nil && strings.HasPrefix(client, "bench-worker-")
}

type takeoverSample struct {
	claim, commit time.Duration
	leader        bool
}

func (r *runner) takeoverSection(ctx context.Context) error {
	o := r.opts
	pool, dbURL, err := r.sectionDB(ctx, "takeover")
	if err != nil {
		return err
	}
	defer pool.Close()
	bank, _, stopBank, err := startBank()
	if err != nil {
		return err
	}
	defer stopBank()
	inserter, err := insertClient(pool)
	if err != nil {
		return err
	}
	plan, err := settlement.Plan{Shards: 1}.Compile()
	if err != nil {
		return err
	}
	wo := workerOpts{dbURL: dbURL, bankURL: bank.URL(), lease: o.lease, batch: takeoverBatch, slots: 2, maintenance: o.takeoverMaintenance}
	procs := map[int]*workerProc{}
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	for range o.takeoverProcs {
		p, err := startWorker(ctx, wo)
		if err != nil {
			return err
		}
		procs[p.pid] = p
	}

	dates := newDateSeq()
	deliveries, err := r.deliveryTakeovers(ctx, pool, bank, procs, wo, dates)
	if err != nil {
		return err
	}

	perRun := r.templateMerchants()
	var key string
	var samples []takeoverSample
	for i := 0; i < o.kills; i++ {
		// A run mid-way, owned, with a step committed under its current token.
		var st checkpointRow
		deadline := time.Now().Add(30 * time.Second)
		for {
			if key != "" {
				if st, err = readCheckpoint(ctx, pool, key); err != nil {
					return err
				}
			}
			if key == "" || st.runStatus == string(workflow.RunStatusSucceeded) || st.cursor > int64(perRun)*9/10 {
				keys, err := startDate(ctx, pool, inserter, plan, dates.take(), perRun)
				if err != nil {
					return err
				}
				key = keys[0]
				continue
			}
			if st.owner != nil && st.leaseLive && st.runStatus == string(workflow.RunStatusRunning) {
				if pid, ok := ownerPid(*st.owner); ok && procs[pid] != nil {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("run %s has no live owner among the workers after 30s (owner %v, status %s)", key, deref(st.owner), st.runStatus)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Let the owner commit a step first, so the kill lands mid-run, not at its claim.
		for first := st.steps; st.steps == first; {
			time.Sleep(2 * time.Millisecond)
			if st, err = readCheckpoint(ctx, pool, key); err != nil {
				return err
			}
		}
		pid, _ := ownerPid(*st.owner)
		var leaderID string
		_ = pool.QueryRow(ctx, `SELECT leader_id FROM river_leader LIMIT 1`).Scan(&leaderID)
		victim := procs[pid]
		killedAt := time.Now()
		victim.kill()
		delete(procs, pid)

		s := takeoverSample{leader: leaderID == workerID(pid)}
		claimStepsSeen := int64(-1)
		for {
			now := time.Now()
			if now.Sub(killedAt) > 2*time.Minute {
				return fmt.Errorf("run %s not taken over 2 minutes after its owner (pid %d) was killed", key, pid)
			}
			c, err := readCheckpoint(ctx, pool, key)
			if err != nil {
				return err
			}
			if c.token > st.token {
				if claimStepsSeen < 0 {
					s.claim, claimStepsSeen = now.Sub(killedAt), c.steps
				}
				if c.steps > claimStepsSeen || c.runStatus == string(workflow.RunStatusSucceeded) {
					s.commit = now.Sub(killedAt)
					break
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		samples = append(samples, s)
		r.log.Info("takeover", "kill", i+1, "pid", pid, "leader", s.leader, "claim", s.claim, "commit", s.commit)
		p, err := startWorker(ctx, wo)
		if err != nil {
			return err
		}
		procs[p.pid] = p
	}

	commits := make([]time.Duration, 0, len(samples))
	var leaderCommits []time.Duration
	for _, s := range samples {
		commits = append(commits, s.commit)
		if s.leader {
			leaderCommits = append(leaderCommits, s.commit)
		}
	}
	target := o.lease + 2*time.Second
	r.printf("\n== takeover: kill -9 of the worker process holding a run, until another process commits the run's next step ==\n")
	r.printf("%d kills, lease %s, %d worker processes (the sample's Service; maintenance: %s): median %s, max %s (target <= lease + 2s = %s: %s)\n",
		len(samples), o.lease, o.takeoverProcs, o.takeoverMaintenance, fmtDur(medianOf(commits)), fmtDur(slices.Max(commits)), target, verdict(slices.Max(commits) <= target))
	r.check(slices.Max(commits) <= target, "takeover <= lease + 2s = %s: max %s of %d kills", target, fmtDur(slices.Max(commits)), len(samples))
	if len(leaderCommits) > 0 {
		r.printf("of which %d killed River's leader: median %s, max %s\n", len(leaderCommits), fmtDur(medianOf(leaderCommits)), fmtDur(slices.Max(leaderCommits)))
	}
	claims := make([]time.Duration, 0, len(samples))
	for _, s := range samples {
		claims = append(claims, s.claim)
	}
	r.printf("claim by the successor (token moved): median %s, max %s\n", fmtDur(medianOf(claims)), fmtDur(slices.Max(claims)))

	dtarget := outbox.DispatcherLeaseDefault + 2*time.Second
	r.printf("delivery takeover after kill -9 of the process running the payout dispatcher, until a payout enqueued after the kill is SUCCEEDED: "+
		"%d kills, outbox lease %s: median %s, max %s (target <= outbox lease + 2s = %s: %s)\n",
		len(deliveries), outbox.DispatcherLeaseDefault, fmtDur(medianOf(deliveries)), fmtDur(slices.Max(deliveries)), dtarget, verdict(slices.Max(deliveries) <= dtarget))
	r.check(slices.Max(deliveries) <= dtarget, "delivery takeover <= outbox lease + 2s = %s: max %s of %d kills", dtarget, fmtDur(slices.Max(deliveries)), len(deliveries))
	return nil
}

// deliveryTakeovers kill -9s, o.kills times, the worker process running the payout dispatcher
// while it is busy (one payout's answer held back by the bank), and measures how long after
// the kill a payout enqueued after it is SUCCEEDED: River keeps the dead dispatcher's job
// "running" and swallows the wakes, so delivery resumes only when a surviving process's
// outbox maintenance sees the heartbeat older than the outbox lease and starts a takeover.
func (r *runner) deliveryTakeovers(ctx context.Context, pool *pgxpool.Pool, bank *fakebank.Bank, procs map[int]*workerProc,
	wo workerOpts, dates *dateSeq) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < r.opts.kills; i++ {
		// A busy dispatcher: the bank holds the next answer back past the payout timeout. The
		// kill waits until that request reached the bank: killed before, the dispatcher would
		// leave the held answer to the next payout, and the bench would time the bank.
		held := bank.Stats().Faults[fakebank.DelayAfterApply]
		bank.FailNext(1, fakebank.DelayAfterApply)
		if _, err := pendingPayouts(ctx, pool, dates, 1); err != nil {
			return nil, err
		}
		var pid int
		deadline := time.Now().Add(30 * time.Second)
		for {
			var owner string
			err := pool.QueryRow(ctx, `SELECT d.owner FROM stepwise_outbox_dispatcher d
				WHERE d.kind = $1 AND d.heartbeat_at > now() - interval '2 seconds'`, settlement.PayoutKind).Scan(&owner)
			if bank.Stats().Faults[fakebank.DelayAfterApply] == held {
				err = pgx.ErrNoRows // not in flight yet
			}
			if err == nil {
				id, _, _ := strings.Cut(strings.TrimPrefix(owner, "outbox/"), "#")
				if p, ok := ownerPid(id); ok && procs[p] != nil {
					pid = p
					break
				}
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return nil, fmt.Errorf("finding the payout dispatcher: %w", err)
			}
			if time.Now().After(deadline) {
				return nil, errors.New("no worker process ran a busy payout dispatcher within 30s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		var leaderID string
		_ = pool.QueryRow(ctx, `SELECT leader_id FROM river_leader LIMIT 1`).Scan(&leaderID)
		killedAt := time.Now()
		procs[pid].kill()
		delete(procs, pid)

		date, err := pendingPayouts(ctx, pool, dates, 1)
		if err != nil {
			return nil, err
		}
		for {
			var done bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stepwise_operation
				WHERE kind = $1 AND state = 'SUCCEEDED' AND split_part(business_key, '/', 1) = $2)`,
				settlement.PayoutKind, date.Format(time.DateOnly)).Scan(&done); err != nil {
				return nil, fmt.Errorf("reading the payout of %s: %w", date.Format(time.DateOnly), err)
			}
			if done {
				break
			}
			if time.Since(killedAt) > 2*time.Minute {
				return nil, fmt.Errorf("payout of %s not delivered 2 minutes after the dispatcher's process (pid %d) was killed", date.Format(time.DateOnly), pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
		took := time.Since(killedAt)
		out = append(out, took)
		r.log.Info("delivery takeover", "kill", i+1, "pid", pid, "leader", leaderID == workerID(pid), "took", took)
		p, err := startWorker(ctx, wo)
		if err != nil {
			return nil, err
		}
		procs[p.pid] = p
	}
	return out, nil
}

func medianOf(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(median(xs))
}

// ratioAgainst prints ratio for a target line against limit: two decimals, or three when two
// would round it onto the limit from the other side (0.948 against 0.95 reads "0.948", not a
// MISSED "0.95").
func ratioAgainst(ratio, limit float64) string {
	two := fmt.Sprintf("%.2f", ratio)
	if two == fmt.Sprintf("%.2f", limit) && ratio != limit {
		return fmt.Sprintf("%.3f", ratio)
	}
	return two
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
