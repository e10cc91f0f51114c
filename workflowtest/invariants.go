package workflowtest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Violation is one broken invariant, with the rows that prove it.
type Violation struct {
	// Invariant is the invariant's number in docs/design.md, section Invariants (1-6;
	// domain checks choose theirs).
	Invariant int
	// Name says what should have held.
	Name string
	// Evidence names the keys, tokens and rows that break it.
	Evidence string
}

func (v Violation) String() string {
	return fmt.Sprintf("invariant %d (%s) violated: %s", v.Invariant, v.Name, v.Evidence)
}

// CheckFunc is a domain invariant check (money balances, one effect per key at the
// external system...). It returns every violation it finds.
type CheckFunc func(ctx context.Context, q stepwisetype.DBTX) ([]Violation, error)

// CheckOpts are options for CheckInvariants.
type CheckOpts struct {
	// Quiet says the system has run to quiet: every operation must then be in an end
	// state and every due slot finished. Without it, only the invariants that hold at every
	// instant are checked.
	Quiet bool

	// Domain checks run after Stepwise's own.
	Domain []CheckFunc

	// Requests is the external system's request log, from your fake or sandbox (see
	// Request). When set, the send discipline is checked against it: no two requests for one
	// operation in flight at once; none after the ledger recorded the operation SUCCEEDED,
	// FAILED_PERMANENT or MANUAL unless a person resolved it back; a resend after a not-found
	// lookup only once the previous request ended plus Grace; every effect one ledger
	// operation's, with its amount, and at most one per operation.
	Requests []Request

	// Grace is the reconciler's grace period (stepwise.KindConfig.Grace), for the resend check.
	Grace time.Duration

	// Runs limits the checks to these runs (keys), the operations they wrote, their slots
	// and their audit events, read through indexes: a check of one business date then costs
	// that date's rows, not the whole history. A duplicate of one of them under another key
	// (a second run of their slot, a second operation of one of their business keys) is
	// still found. Nil checks the whole database.
	Runs []string
	// Liveness is what the harness knows of its worker processes. When set, every takeover
	// of a run whose holder was alive, running and connected is a violation, and so is a
	// run failed with fewer crashes and errors than MaxAttempts.
	Liveness *Liveness
}

// CheckInvariants checks invariants 1, 2, 4 and 5 of docs/design.md over Stepwise's tables, then opts'
// domain checks, and returns every violation found (nil when all hold). An error means a
// check could not run, not that an invariant failed.
func CheckInvariants(ctx context.Context, q stepwisetype.DBTX, opts *CheckOpts) ([]Violation, error) {
	if opts == nil {
		opts = &CheckOpts{}
	}
	var out []Violation
	for _, c := range stepwiseChecks {
		if c.quietOnly && !opts.Quiet {
			continue
		}
		sql, args := scoped(c.sql, opts.Runs)
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return out, fmt.Errorf("checking invariant %d (%s): %w", c.invariant, c.name, err)
		}
		evidence, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return out, fmt.Errorf("checking invariant %d (%s): %w", c.invariant, c.name, err)
		}
		for _, e := range evidence {
			out = append(out, Violation{Invariant: c.invariant, Name: c.name, Evidence: e})
		}
	}
	if opts.Requests != nil {
		ops, events, err := loadLedger(ctx, q, opts.Runs)
		if err != nil {
			return out, fmt.Errorf("checking the request log: %w", err)
		}
		out = append(out, checkRequests(opts.Requests, ops, events, opts.Grace)...)
	}
	if opts.Liveness != nil {
		_, vs, err := CountTakeovers(ctx, q, opts.Liveness)
		if err != nil {
			return out, fmt.Errorf("checking takeovers: %w", err)
		}
		out = append(out, vs...)
	}
	for _, check := range opts.Domain {
		vs, err := check(ctx, q)
		if err != nil {
			return out, err
		}
		out = append(out, vs...)
	}
	return out, nil
}

// stepwiseChecks are the SQL checks of CheckInvariants: each returns one evidence line per
// violation. Quiet-only checks hold only once the system ran to quiet (CheckOpts.Quiet).
var stepwiseChecks = []struct {
	invariant int
	name      string
	quietOnly bool
	sql       string
}{
	{1, "one run per (schedule, slot, shard)", false, `
		SELECT format('schedule %s slot %s shard %s has %s runs: %s', schedule, slot, shard, count(*), string_agg(key, ', '))
		  FROM stepwise_run WHERE schedule IS NOT NULL{{slots:schedule, slot}}
		 GROUP BY schedule, slot, shard HAVING count(*) > 1`},
	{1, "one operation per (kind, business_key)", false, `
		SELECT format('%s %s has %s operations: %s', kind, business_key, count(*), string_agg(operation_id::text, ', '))
		  FROM stepwise_operation WHERE true{{opkeys}} GROUP BY kind, business_key HAVING count(*) > 1`},
	{2, "fencing tokens per key strictly increase", false, `
		SELECT format('key %s: claim token %s (event %s) after token %s', subject, token, id, prev)
		  FROM (SELECT id, subject, token, lag(token) OVER (PARTITION BY subject ORDER BY id) AS prev
		          FROM stepwise_event WHERE kind = 'lease.claim'{{runs:subject}}) t
		 WHERE prev IS NOT NULL AND token <= prev`},
	{2, "a run finishes under the newest token claimed for it", false, `
		SELECT format('run %s finished as %s under token %s, but token %s had been claimed before', f.subject, f.to_state, f.token, c.max_token)
		  FROM stepwise_event f
		  JOIN LATERAL (SELECT max(token) AS max_token FROM stepwise_event c
		                 WHERE c.subject = f.subject AND c.kind = 'lease.claim' AND c.id < f.id) c ON true
		 WHERE f.kind = 'run.finish' AND f.token IS NOT NULL AND f.token < c.max_token{{runs:f.subject}}`},
	{4, "no operation PROCESSING without a live lease", true, `
		SELECT format('operation %s (%s %s) is PROCESSING, lease lapsed at %s', operation_id, kind, business_key, lease_until)
		  FROM stepwise_operation WHERE state = 'PROCESSING' AND lease_until < now(){{runs:run_key}}`},
	{4, "every operation ends SUCCEEDED, FAILED_PERMANENT or MANUAL", true, `
		SELECT format('operation %s (%s %s) is still %s (attempts %s, last error %s)', operation_id, kind, business_key, state, attempts, coalesce(last_error, '-'))
		  FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL'){{runs:run_key}}`},
	{5, "every run ends succeeded or failed", true, `
		SELECT format('run %s is still %s (attempts %s, last error %s)', key, status, attempts, coalesce(last_error, '-'))
		  FROM stepwise_run WHERE status IN ('pending', 'running'){{runs:key}}`},
	{5, "every materialized slot has one run per shard", false, `
		SELECT format('schedule %s slot %s was materialized with %s shards but has %s runs', s.schedule, s.slot, s.shards, count(r.key))
		  FROM stepwise_schedule_slot s
		  LEFT JOIN stepwise_run r ON r.schedule = s.schedule AND r.slot = s.slot
		 WHERE s.status = 'materialized'{{slots:s.schedule, s.slot}}
		 GROUP BY s.schedule, s.slot, s.shards HAVING count(r.key) <> s.shards`},
	{5, "every due slot ends with finished runs, or recorded as skipped", true, `
		SELECT format('schedule %s slot %s is %s%s', s.schedule, s.slot, s.status,
		              CASE WHEN s.status = 'materialized' THEN ' but some of its runs have not finished' ELSE '' END)
		  FROM stepwise_schedule_slot s
		 WHERE s.slot <= now() AND (s.status = 'buffered' OR (s.status = 'materialized' AND EXISTS (
		        SELECT 1 FROM stepwise_run r WHERE r.schedule = s.schedule AND r.slot = s.slot AND r.status IN ('pending', 'running')))){{slots:s.schedule, s.slot}}`},
}

// scopeRE matches the scope markers of the checks' SQL: {{runs:COLUMN}} (COLUMN is one of
// the runs), {{slots:SCHEDULE, SLOT}} (the pair is a slot of one of the runs) and {{opkeys}}
// (the operation's kind and business key are those of an operation one of the runs wrote);
// {{opsubjects}} (an event's subject is an operation one of the runs wrote).
var scopeRE = regexp.MustCompile(`\{\{(runs|slots|opkeys|opsubjects):?([^}]*)\}\}`)

// scoped returns sql limited to runs ($1), or over everything when runs is nil.
func scoped(sql string, runs []string) (string, []any) {
	out := scopeRE.ReplaceAllStringFunc(sql, func(m string) string {
		if runs == nil {
			return ""
		}
		parts := scopeRE.FindStringSubmatch(m)
		switch parts[1] {
		case "runs":
			return " AND " + parts[2] + " = ANY($1)"
		case "slots":
			return " AND (" + parts[2] + ") IN (SELECT schedule, slot FROM stepwise_run WHERE key = ANY($1) AND schedule IS NOT NULL)"
		case "opsubjects":
			return " AND subject = ANY(ARRAY(SELECT 'op:' || operation_id::text FROM stepwise_operation WHERE run_key = ANY($1)))"
		default:
			return " AND (kind, business_key) IN (SELECT kind, business_key FROM stepwise_operation WHERE run_key = ANY($1))"
		}
	})
	if runs == nil {
		return out, nil
	}
	return out, []any{runs}
}

// FormatViolations renders violations one per line, first the first (the one to look at).
func FormatViolations(vs []Violation) string {
	var b strings.Builder
	for _, v := range vs {
		b.WriteString(v.String())
		b.WriteByte('\n')
	}
	return b.String()
}
