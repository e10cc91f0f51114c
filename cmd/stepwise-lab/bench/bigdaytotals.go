package bench

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/memwatch"
	"github.com/stepwise-go/stepwise/internal/reconcile"
)

// The big day's totals: reconcile.CompareTotals of the whole day against the bank's statement
// of it, then of a tenth of the day, timed and with the heap the comparison adds on top of the
// statement. Issue 27 item 2: the day in ≤ 2 s, memory that does not grow with the day.
//
// The statement is what the bank holds once the day is reconciled: every SUCCEEDED payout,
// same key and amount, in the order applied, as a statement client returns it parsed. The
// bank's fake never saw the seeded payouts (they were seeded as already paid), so the
// statement is read from the ledger before the clock starts, and a few differences are planted
// in it so that the comparison also has to find something: the section fails unless it finds
// exactly those.

// totalsRounds is how many times each period is compared (the median is reported).
const totalsRounds = 3

// plantedDifferences is what the statement built by dayStatement disagrees on.
var plantedDifferences = map[reconcile.DifferenceKind]int{
	reconcile.DifferenceAmountDiffers: 2, // two amounts one cent off
	reconcile.DifferenceOnlyHere:      3, // three payouts the bank does not list
	reconcile.DifferenceDuplicate:     2, // two payouts the bank applied twice
	reconcile.DifferenceOnlyThere:     3, // three payments the ledger never made
}

// totalsMeasure is one period's comparisons.
type totalsMeasure struct {
	payouts int             // SUCCEEDED payouts in the period
	entries int             // statement entries
	took    []time.Duration // per round, sorted
	beyond  uint64          // the largest heap peak above the statement's, over the rounds
	runs    []measurement   // per round: the payouts compared, the time and the server's CPU time
}

func (m totalsMeasure) median() time.Duration { return m.took[len(m.took)/2] }

func (r *runner) bigDayTotals(ctx context.Context, pool *pgxpool.Pool) error {
	var from, last time.Time
	var n int
	if err := pool.QueryRow(ctx, `SELECT min(greatest(last_sent_at, claimed_at)), max(greatest(last_sent_at, claimed_at)), count(*)
		FROM stepwise_operation WHERE kind = $1 AND state = 'SUCCEEDED'`, settlement.PayoutKind).Scan(&from, &last, &n); err != nil {
		return fmt.Errorf("reading the big day's period: %w", err)
	}
	to := last.Add(time.Millisecond)
	// The passes' outcomes written out first, so that the checkpointer is not counted as the
	// comparisons' database CPU. Best effort, as before the passes.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		r.progress("bigday: CHECKPOINT refused (%v): the passes' pages may be written during the comparisons", err)
	}
	r.progress("bigday: reading the day's statement (%d payouts sent from %s to %s)...", n, from.UTC().Format(time.DateTime), last.UTC().Format(time.DateTime))
	entries, err := dayStatement(ctx, pool, from, to)
	if err != nil {
		return err
	}
	whole, err := r.compareTotals(ctx, pool, entries, from, to, plantedDifferences)
	if err != nil {
		return err
	}
	// A tenth of the day, with the statement's entries of that tenth (the planted differences
	// fall in it or not; only time and memory are measured).
	tenthTo := from.Add(to.Sub(from) / 10)
	var part []reconcile.StatementEntry
	for _, e := range entries {
		if !e.At.Before(from) && e.At.Before(tenthTo) {
			part = append(part, e)
		}
	}
	tenth, err := r.compareTotals(ctx, pool, part, from, tenthTo, nil)
	if err != nil {
		return err
	}
	growth := int64(whole.beyond) - int64(tenth.beyond)
	statementMiB := float64(len(entries)) * float64(statementEntryBytes) / (1 << 20)
	r.printf("CompareTotals of the day: %s payouts against a statement of %s entries (about %.0f MiB, %d differences planted, all found):\n",
		groupThousands(int64(whole.payouts)), groupThousands(int64(whole.entries)), statementMiB, sumCounts(plantedDifferences))
	r.printf("  whole day  %9s payouts  median %s [%s-%s] of %d (target <= 2s), heap beyond the statement %.1f MiB%s\n",
		groupThousands(int64(whole.payouts)), fmtDur(whole.median()), fmtDur(whole.took[0]), fmtDur(whole.took[len(whole.took)-1]), len(whole.took), mib(whole.beyond), totalsCPU(whole))
	r.printf("  tenth      %9s payouts  median %s [%s-%s] of %d, heap beyond the statement %.1f MiB%s\n",
		groupThousands(int64(tenth.payouts)), fmtDur(tenth.median()), fmtDur(tenth.took[0]), fmtDur(tenth.took[len(tenth.took)-1]), len(tenth.took), mib(tenth.beyond), totalsCPU(tenth))
	r.printf("  %s more payouts add %.2f MiB beyond the statement (target: memory independent of the day's size, <= 1 MiB more)\n",
		groupThousands(int64(whole.payouts-tenth.payouts)), float64(growth)/(1<<20))
	r.check(whole.median() <= 2*time.Second, "CompareTotals of a %s-payout day <= 2s: %s", groupThousands(int64(whole.payouts)), fmtDur(whole.median()))
	r.check(growth <= 1<<20, "CompareTotals' memory beyond the statement independent of the day's size (%s payouts %.1f MiB, %s payouts %.1f MiB)",
		groupThousands(int64(whole.payouts)), mib(whole.beyond), groupThousands(int64(tenth.payouts)), mib(tenth.beyond))
	return nil
}

// totalsCPU is a period's database CPU (see dbCPULine), or "" where it was not measured.
func totalsCPU(m totalsMeasure) string {
	if l := dbCPULine(m.runs, "payout"); l != "-" {
		return ", database CPU " + l
	}
	return ""
}

// statementEntryBytes is roughly what one parsed entry holds: the struct, its key's string and
// its reference's.
const statementEntryBytes = 80 + 48 + 16

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func sumCounts(m map[reconcile.DifferenceKind]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}

// dayStatement is the bank's statement of the SUCCEEDED payouts sent in [from, to), in the
// order applied, with plantedDifferences in it.
func dayStatement(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) ([]reconcile.StatementEntry, error) {
	rows, err := pool.Query(ctx, `SELECT operation_id, amount, greatest(last_sent_at, claimed_at) FROM stepwise_operation
		WHERE kind = $1 AND state = 'SUCCEEDED' AND greatest(last_sent_at, claimed_at) >= $2 AND greatest(last_sent_at, claimed_at) < $3
		ORDER BY 3`, settlement.PayoutKind, from, to)
	if err != nil {
		return nil, fmt.Errorf("reading the big day's statement: %w", err)
	}
	defer rows.Close()
	var out []reconcile.StatementEntry
	var id uuid.UUID
	var amount int64
	var at time.Time
	for rows.Next() {
		if err := rows.Scan(&id, &amount, &at); err != nil {
			return nil, fmt.Errorf("reading the big day's statement: %w", err)
		}
		out = append(out, reconcile.StatementEntry{Key: id.String(), ExternalRef: "pay_" + strconv.Itoa(len(out)), Amount: amount, Currency: "EUR", At: at})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the big day's statement: %w", err)
	}
	if len(out) < 100 {
		return nil, fmt.Errorf("the big day's statement has %d entries: too few to plant differences in", len(out))
	}
	// Planted at fixed positions spread over the day (the options allow no fewer than 100
	// payouts).
	k := len(out) / 10
	out[1*k].Amount++
	out[2*k].Amount++
	for i := range 2 {
		d := out[(5+i)*k]
		d.ExternalRef += "-again"
		d.At = to.Add(-time.Microsecond)
		out = append(out, d)
	}
	for range 3 {
		out = append(out, reconcile.StatementEntry{Key: uuid.NewString(), ExternalRef: "pay_foreign", Amount: 500, Currency: "EUR", At: to.Add(-time.Microsecond)})
	}
	// The three payouts the bank does not list, last, so the positions above stay put.
	for _, i := range []int{9 * k, 8 * k, 7 * k} {
		out = slices.Delete(out, i, i+1)
	}
	return out, nil
}

// compareTotals compares [from, to) against entries totalsRounds times, each round on a fresh
// copy in the order given (CompareTotals reorders its copy in place), and checks the differences
// against want (nil: expect none beyond what the entries hold, unchecked).
func (r *runner) compareTotals(ctx context.Context, pool *pgxpool.Pool, entries []reconcile.StatementEntry, from, to time.Time,
	want map[reconcile.DifferenceKind]int) (totalsMeasure, error) {
	m := totalsMeasure{entries: len(entries)}
	params := &reconcile.TotalsParams{Kind: settlement.PayoutKind, From: from, To: to}
	for range totalsRounds {
		stmt := slices.Clone(entries)
		var t *reconcile.Totals
		var err error
		var took time.Duration
		db := r.dbCPU() // outside HeapPeak: reading /proc allocates
		peak := memwatch.HeapPeak(func() {
			start := time.Now()
			t, err = reconcile.CompareTotals(ctx, pool, reconcile.StatementFunc(func(context.Context, time.Time, time.Time) ([]reconcile.StatementEntry, error) {
				return stmt, nil
			}), params)
			took = time.Since(start)
		})
		dbUsed := db.used()
		if err != nil {
			return m, fmt.Errorf("comparing the big day's totals: %w", err)
		}
		if want != nil {
			for _, k := range []reconcile.DifferenceKind{reconcile.DifferenceAmountDiffers, reconcile.DifferenceOnlyHere, reconcile.DifferenceDuplicate, reconcile.DifferenceOnlyThere} {
				if t.Counts[k] != want[k] {
					return m, fmt.Errorf("comparing the big day's totals: %d differences %s, %d planted:\n%s", t.Counts[k], k, want[k], t)
				}
			}
		}
		m.payouts = t.Here["EUR"].Count
		m.took = append(m.took, took)
		m.runs = append(m.runs, measurement{items: t.Here["EUR"].Count, elapsed: took, db: dbUsed})
		m.beyond = max(m.beyond, peak)
		r.progress("bigday: CompareTotals of %d payouts in %s, heap +%.1f MiB beyond the statement", m.payouts, fmtDur(took), mib(peak))
	}
	sort.Slice(m.took, func(i, j int) bool { return m.took[i] < m.took[j] })
	return m, nil
}
