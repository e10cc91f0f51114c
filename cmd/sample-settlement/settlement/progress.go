package settlement

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/workflow"
)

// Progress is a cheap snapshot of a date's settlement, for progress displays and for waiting
// until the date is at rest. It reads through indexes only (runs by key, operations by run
// key, settlements by date), so polling it does not load the database.
type Progress struct {
	// Runs counts the date's runs by status.
	Runs map[string]int
	// Operations counts the payouts of the date's runs by ledger state.
	Operations map[string]int
	// Settlements is how many settlements the date has.
	Settlements int
	// Waiting is how many of the date's runs wait for their payouts to be at rest
	// (ServiceConfig.PayoutsAtRestTimeout), not woken yet.
	Waiting int
}

// AtRest reports whether nothing more will happen by itself: every run finished and every
// payout is SUCCEEDED, FAILED_PERMANENT or MANUAL. A run waiting for its payouts counts as
// finished while a payout is MANUAL: it waits for a person (without one, its payouts at
// rest wake it, and it closes its shard).
func (p *Progress) AtRest(shards int) bool {
	finished := p.Runs[string(workflow.RunStatusSucceeded)] + p.Runs[string(workflow.RunStatusFailed)] + p.Runs[string(workflow.RunStatusCancelled)]
	if p.Waiting > 0 && p.Operations["MANUAL"] > 0 {
		finished += p.Waiting
	}
	if finished < shards {
		return false
	}
	for state, n := range p.Operations {
		if n > 0 && state != "SUCCEEDED" && state != "FAILED_PERMANENT" && state != "MANUAL" {
			return false
		}
	}
	return true
}

// Settled counts the payouts with a final outcome (SUCCEEDED, FAILED_PERMANENT) or waiting for
// a person (MANUAL).
func (p *Progress) Settled() int {
	return p.Operations["SUCCEEDED"] + p.Operations["FAILED_PERMANENT"] + p.Operations["MANUAL"]
}

// ReadProgress reads the progress of date.
func ReadProgress(ctx context.Context, pool *pgxpool.Pool, plan Plan, date time.Time) (*Progress, error) {
	keys, err := plan.RunKeys(date)
	if err != nil {
		return nil, err
	}
	p := &Progress{Runs: map[string]int{}, Operations: map[string]int{}}
	rows, err := pool.Query(ctx, `
		SELECT 'run', status, count(*)::int FROM stepwise_run WHERE key = ANY($1) GROUP BY status
		UNION ALL
		SELECT 'op', state, count(*)::int FROM stepwise_operation WHERE run_key = ANY($1) GROUP BY state
		UNION ALL
		SELECT 'settlements', '', count(*)::int FROM settlement WHERE settle_date = $2
		UNION ALL
		SELECT 'waiting', '', count(*)::int FROM stepwise_wait WHERE run_key = ANY($1) AND woken_at IS NULL`, keys, date)
	if err != nil {
		return nil, fmt.Errorf("reading the progress of %s: %w", date.Format(time.DateOnly), err)
	}
	var what, key string
	var n int
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(&what, &key, &n); err != nil {
			return nil, fmt.Errorf("reading the progress of %s: %w", date.Format(time.DateOnly), err)
		}
		switch what {
		case "run":
			p.Runs[key] = n
		case "op":
			p.Operations[key] = n
		case "waiting":
			p.Waiting = n
		default:
			p.Settlements = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the progress of %s: %w", date.Format(time.DateOnly), err)
	}
	return p, nil
}

// ExpectedSettlements is how many settlements date will have once settled: its distinct
// (merchant, type, currency) groups of transactions.
func ExpectedSettlements(ctx context.Context, pool *pgxpool.Pool, date time.Time) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT DISTINCT merchant_id, type, currency FROM card_txn WHERE business_date = $1) g`, date).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting the settlements %s will have: %w", date.Format(time.DateOnly), err)
	}
	return n, nil
}

// WaitAtRest polls the progress of date every interval until it is at rest, calling tick
// (if not nil) with each snapshot. It returns the last snapshot, with ctx's error if ctx
// ends first.
func WaitAtRest(ctx context.Context, pool *pgxpool.Pool, plan Plan, date time.Time, interval time.Duration, tick func(*Progress)) (*Progress, error) {
	plan, err := plan.compiled()
	if err != nil {
		return nil, err
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	last := &Progress{Runs: map[string]int{}, Operations: map[string]int{}}
	for {
		p, err := ReadProgress(ctx, pool, plan, date)
		if err != nil {
			if ctx.Err() != nil {
				return last, ctx.Err()
			}
			return last, err
		}
		last = p
		if tick != nil {
			tick(p)
		}
		if p.AtRest(plan.Shards) {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-t.C:
		}
	}
}
