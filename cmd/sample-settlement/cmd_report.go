package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

func init() {
	prog.Register("report", "a date's batch status by evidence, payouts per state, totals against the bank's statement", runReport)
	prog.Register("invariants", "check the invariants 1-6 of docs/design.md for a date against the database and the bank", runInvariants)
}

// dateCommand is what the per-date read commands (report, invariants) share: their flags,
// parsed and checked, and an open pool.
type dateCommand struct {
	pool   *pgxpool.Pool
	bank   settlement.Bank
	plan   settlement.Plan
	date   time.Time
	asJSON bool
	grace  time.Duration
}

func parseDateCommand(ctx context.Context, name, what string, args []string, stderr io.Writer) (*dateCommand, error) {
	fs := prog.NewFlagSet(name, name+" --date YYYY-MM-DD [--json]", stderr)
	var db dbFlags
	var pf planFlags
	var bf bankFlags
	db.register(fs)
	pf.register(fs)
	bf.register(fs)
	date := fs.String("date", "", "business date, YYYY-MM-DD (required)")
	asJSON := fs.Bool("json", false, "print the "+what+" as JSON")
	var grace *time.Duration
	if name == "invariants" {
		grace = fs.Duration("grace", time.Minute, "the reconciler's grace period the service ran with, to judge not-found decisions against the bank's request log")
	}
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return nil, err
	}
	if grace != nil && *grace <= 0 {
		return nil, cmdline.UsageError("--grace %s must be positive: it is the service's reconcile grace period", *grace)
	}
	d, err := parseDateFlag(*date)
	if err != nil {
		return nil, err
	}
	plan, err := pf.plan()
	if err != nil {
		return nil, err
	}
	bank, err := bf.client(10 * time.Second)
	if err != nil {
		return nil, err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return nil, err
	}
	c := &dateCommand{pool: pool, bank: bank, plan: plan, date: d, asJSON: *asJSON}
	if grace != nil {
		c.grace = *grace
	}
	return c, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func runReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseDateCommand(ctx, "report", "report", args, stderr)
	if err != nil {
		return err
	}
	defer c.pool.Close()
	rep, err := settlement.BuildReport(ctx, c.pool, c.bank, c.plan, c.date)
	if err != nil {
		return err
	}
	if c.asJSON {
		return writeJSON(stdout, rep)
	}
	printReport(stdout, rep)
	return nil
}

func runInvariants(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseDateCommand(ctx, "invariants", "checks", args, stderr)
	if err != nil {
		return err
	}
	defer c.pool.Close()
	res, err := settlement.CheckInvariantsOpts(ctx, c.pool, c.bank, c.plan, c.date, &settlement.InvariantOpts{Grace: c.grace})
	if err != nil {
		return err
	}
	if c.asJSON {
		if err := writeJSON(stdout, res); err != nil {
			return err
		}
	} else {
		printInvariants(stdout, res)
	}
	return res.Err()
}

func printInvariants(w io.Writer, res *settlement.Result) {
	fmt.Fprintf(w, "invariants for %s:\n", res.Date)
	for _, c := range res.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		num := fmt.Sprint(c.Invariant)
		if c.Invariant == 0 {
			num = "1-5"
		}
		fmt.Fprintf(w, "  %s %s. %s\n", mark, num, c.Name)
		for _, line := range strings.Split(c.Evidence, "\n") {
			fmt.Fprintf(w, "         %s\n", line)
		}
	}
	if res.OK() {
		fmt.Fprintln(w, "all invariants hold")
	}
}

func printReport(w io.Writer, r *settlement.Report) {
	fmt.Fprintf(w, "settlement of %s (slot %s, %d shards)\n", r.Date, r.Slot.Format(time.RFC3339), r.Shards)
	fmt.Fprintf(w, "  batch status:  %s   (by evidence: runs %s; their payouts %s)\n", r.Batch, counts(r.Runs), counts(r.Operations))
	fmt.Fprintf(w, "  settlements:   %s\n", counts(r.Settlements))
	fmt.Fprintf(w, "  payouts:       %s\n", counts(r.Operations))
	if r.OldestUnknown > 0 {
		fmt.Fprintf(w, "  oldest unknown payout: %s\n", r.OldestUnknown)
	} else {
		fmt.Fprintln(w, "  oldest unknown payout: none")
	}
	fmt.Fprintln(w, "  totals per currency:")
	fmt.Fprintf(w, "    %-4s %9s %20s %13s %20s %9s %20s %9s %20s  %s\n",
		"cur", "txns", "amount", "settlements", "settled", "paid", "paid amount", "at bank", "bank amount", "")
	for _, t := range r.Totals {
		mark := "match"
		if !t.Match {
			mark = "DIFFERS"
		}
		fmt.Fprintf(w, "    %-4s %9d %20s %13d %20s %9d %20s %9d %20s  %s\n",
			t.Currency, t.Transactions.Count, money(t.Transactions.Sum, t.Currency), t.Settled.Count, money(t.Settled.Sum, t.Currency),
			t.Paid.Count, money(t.Paid.Sum, t.Currency), t.Bank.Count, money(t.Bank.Sum, t.Currency), mark)
		if t.Declined.Count > 0 || t.Open.Count > 0 {
			fmt.Fprintf(w, "         declined %d (%s), not yet proven %d (%s)\n",
				t.Declined.Count, money(t.Declined.Sum, t.Currency), t.Open.Count, money(t.Open.Sum, t.Currency))
		}
	}
	if r.BankError != "" {
		fmt.Fprintf(w, "  bank: not compared (%s)\n", r.BankError)
	} else {
		fmt.Fprintf(w, "  differences with the bank's statement: %d\n", len(r.Differences))
		for i, d := range r.Differences {
			if i == 10 {
				fmt.Fprintf(w, "    ... and %d more (--json lists all)\n", len(r.Differences)-10)
				break
			}
			fmt.Fprintf(w, "    %s: %s (ledger %s, %s here, %s at bank)\n", d.Reference, d.Kind, d.State,
				money(d.Local, d.Currency), money(d.Bank, d.Currency))
		}
		fmt.Fprintf(w, "  duplicate payouts at the bank: %d\n", r.DuplicatePayouts)
	}
	fmt.Fprintf(w, "  closed:        %s\n", dayLine(r.Day))
}

// dayLine says in words where the date's close and reconciliation stand.
func dayLine(d *settlement.Day) string {
	if d == nil {
		return "no (no run waits for its payouts yet)"
	}
	var s string
	switch {
	case d.ClosedAt == nil:
		s = fmt.Sprintf("no: %d of %d shards have every payout proven", d.AtRest, d.Shards)
	default:
		s = "yes, at " + d.ClosedAt.UTC().Format(time.RFC3339) + "; "
		switch {
		case d.ReconciledAt == nil:
			s += "reconciliation waits for the bank's statement (statement-arrived --date " + d.Date + ")"
		case d.Match:
			s += fmt.Sprintf("reconciled with statement %q: match", d.StatementID)
		default:
			s += fmt.Sprintf("reconciled with statement %q: %d differences", d.StatementID, d.Differences)
		}
	}
	if d.OverdueAt != nil {
		s += " (overdue since " + d.OverdueAt.UTC().Format(time.RFC3339) + ")"
	}
	return s
}

func money(minor int64, currency string) string {
	s := settlement.FormatMoney(minor, currency)
	return strings.TrimSuffix(s, " "+currency)
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
