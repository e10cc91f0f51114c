package reconcile_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestTotalsCountAnOperationWhoseSenderDied: a dispatcher claims a payout, its request reaches
// the bank, and it dies before recording anything (no send time in the ledger). Lease recovery
// makes it UNKNOWN_EXTERNAL, the reconciler finds it at the bank and proves it SUCCEEDED. The
// bank's statement lists it on the day it was applied; the ledger must count it on that day
// too, not report it "only there (SUCCEEDED)" — a report contradicting itself.
func TestTotalsCountAnOperationWhoseSenderDied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	from := time.Now().Add(-time.Minute)

	b.enqueue(t, payout(key(1), "acct", 100), payout(key(2), "acct", 200))
	b.drain(t)

	died := payout(key(3), "acct", 300)
	b.enqueue(t, died)
	id := outbox.OperationID("payout", died.BusinessKey)
	// The claim, as the dispatcher's claim statement takes it, with a lease that has run out.
	_, err := b.pool.Exec(ctx, `UPDATE stepwise_operation SET state = 'PROCESSING', claims = claims + 1, claimed_at = now(),
		lease_until = now() - interval '1 second', leased_by = 'killed-worker', updated_at = now() WHERE operation_id = $1`, id)
	require.NoError(t, err)
	// Its request got through before the process was killed.
	_, err = b.client.Pay(ctx, id.String(), fakebank.PaymentRequest{Account: "acct", Amount: 300, Currency: "EUR", Reference: died.BusinessKey})
	require.NoError(t, err)
	n, err := b.ob.RecoverExpired(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = b.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true})
	require.NoError(t, err)
	op := b.get(t, died.BusinessKey)
	require.Equal(t, outbox.StateSucceeded, op.State, "proven by the reconciler")
	require.Nil(t, op.LastSentAt, "no send was ever recorded for it")

	totals, err := reconcile.CompareTotals(ctx, b.pool, bankStatement(b.client),
		&reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	t.Log("\n" + totals.String())
	require.True(t, totals.Match(), totals.String())
	require.Equal(t, map[string]reconcile.Sum{"EUR": {Count: 3, Amount: 600}}, totals.Here)
}

// TestTotalsBoundTheDifferencesListed: a statement missing a whole period (or listing one
// nobody sent) yields as many differences as the period has payouts; the result lists at most
// MaxDifferences of each kind and counts the rest, and the totals still cover everything. A
// key the bank applied twice is a difference of its own.
func TestTotalsBoundTheDifferencesListed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	from := time.Now().Add(-time.Minute)
	var ops []outbox.EnqueueParams
	for i := range 30 {
		ops = append(ops, payout(key(i), "acct", int64(100+i)))
	}
	b.enqueue(t, ops...)
	b.drain(t)
	// The bank's statement: the first ten as applied, then twenty-five it never had here,
	// and the first one a second time.
	entries, err := bankStatement(b.client).Entries(ctx, from, time.Now().Add(time.Minute))
	require.NoError(t, err)
	var stmt []reconcile.StatementEntry
	for _, e := range entries {
		if e.Amount < 110 {
			stmt = append(stmt, e)
		}
	}
	for i := range 25 {
		stmt = append(stmt, reconcile.StatementEntry{Key: uuid.NewString(), ExternalRef: fmt.Sprintf("by-hand-%d", i), Amount: 7, Currency: "EUR", At: time.Now()})
	}
	stmt = append(stmt, stmt[0])
	statement := reconcile.StatementFunc(func(context.Context, time.Time, time.Time) ([]reconcile.StatementEntry, error) {
		return slices.Clone(stmt), nil
	})

	totals, err := reconcile.CompareTotals(ctx, b.pool, statement,
		&reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute), MaxDifferences: 5})
	require.NoError(t, err)
	t.Log("\n" + totals.String())
	require.Equal(t, map[reconcile.DifferenceKind]int{reconcile.DifferenceOnlyHere: 20, reconcile.DifferenceOnlyThere: 25, reconcile.DifferenceDuplicate: 1}, totals.Counts)
	require.Len(t, totals.Differences, 11)
	require.Equal(t, 46, totals.DifferenceCount())
	require.Equal(t, 35, totals.Omitted())
	require.Contains(t, totals.String(), "... and 35 more not listed")
	require.Equal(t, 30, totals.Here["EUR"].Count, "the totals count every operation, listed or not")
	require.Equal(t, 36, totals.There["EUR"].Count)
	for _, d := range totals.Differences {
		switch d.Kind {
		case reconcile.DifferenceOnlyHere:
			require.NotEmpty(t, d.BusinessKey)
			require.Equal(t, outbox.StateSucceeded, d.OurState)
		case reconcile.DifferenceDuplicate:
			require.Equal(t, stmt[0].Key, d.Key)
			require.NotEmpty(t, d.BusinessKey)
		}
	}

	_, err = reconcile.CompareTotals(ctx, b.pool, statement, &reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now(), MaxDifferences: -1})
	require.ErrorContains(t, err, "MaxDifferences -1")
}

// TestTotalsKeysOfAnotherSpelling: keys that cannot be an operation_id's text (upper case,
// short, empty) are only there, with what the ledger holds under the id they spell if any;
// the ledger's own keys still match however the statement is ordered.
func TestTotalsKeysOfAnotherSpelling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	from := time.Now().Add(-time.Minute)
	var ops []outbox.EnqueueParams
	for i := range 50 {
		ops = append(ops, payout(key(i), "acct", int64(100+i)))
	}
	b.enqueue(t, ops...)
	b.drain(t)
	entries, err := bankStatement(b.client).Entries(ctx, from, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Len(t, entries, 50)
	upper := strings.ToUpper(entries[7].Key)
	odd := []reconcile.StatementEntry{{Key: upper, Amount: 1, Currency: "EUR"}, {Key: "x", Amount: 2, Currency: "EUR"},
		{Key: "", Amount: 3, Currency: "EUR"}, {Key: "zzzz-not-hex", Amount: 4, Currency: "EUR"}}
	stmt := append(slices.Clone(odd), entries...)
	slices.Reverse(stmt)
	totals, err := reconcile.CompareTotals(ctx, b.pool, reconcile.StatementFunc(func(context.Context, time.Time, time.Time) ([]reconcile.StatementEntry, error) {
		return stmt, nil
	}), &reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	t.Log("\n" + totals.String())
	require.Equal(t, map[reconcile.DifferenceKind]int{reconcile.DifferenceOnlyThere: 4}, totals.Counts)
	for _, d := range totals.Differences {
		if d.Key == upper {
			require.Equal(t, outbox.StateSucceeded, d.OurState, "the id it spells is ours")
		} else {
			require.Equal(t, outbox.State(""), d.OurState)
		}
	}
}

// TestTotalsFindEachKeyAmongItsNeighbours: the statement is looked up a batch of the ledger's
// rows at a time, through an index of buckets by a hash of the key. Every payout of a period
// longer than a batch shares its bucket with keys the ledger never sent (it is the first, the
// middle or the last of three; one bucket is crowded with sixteen), and differences sit on
// either side of the batches' edges: each payout is found under its own key, each difference
// is reported once, and each kind is listed in key order. The payouts' ids are dated
// (DatedOperationID, as the sample's), a day of which shares its first twelve hex digits.
func TestTotalsFindEachKeyAmongItsNeighbours(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	from := time.Now().Add(-time.Minute)
	const n = 600 // more than two of CompareTotals' batches of 256
	day := time.Now()

	// Dated ids of the day, until n buckets hold three of them: the first n such triples.
	type triple struct {
		keys [3]string
		i    [3]int // the business key's number of each
	}
	var triples []triple
	seen := map[int][]int{}
	idOf := func(i int) string { return outbox.DatedOperationID(day, "payout", key(i)).String() }
	for i := 0; len(triples) < n; i++ {
		bk := reconcile.KeyBucket(idOf(i))
		seen[bk] = append(seen[bk], i)
		if len(seen[bk]) == 3 {
			var tr triple
			for j, x := range seen[bk] {
				tr.i[j], tr.keys[j] = x, idOf(x)
			}
			triples = append(triples, tr)
		}
	}
	// Payout number t is the first, the middle or the last key of its triple.
	var ops []outbox.EnqueueParams
	payoutOf := map[string]bool{}
	for t, tr := range triples {
		idx := []int{0, 1, 2}
		slices.SortFunc(idx, func(x, y int) int { return strings.Compare(tr.keys[x], tr.keys[y]) })
		j := idx[t%3]
		op := payout(key(tr.i[j]), "acct", int64(100+t))
		op.ID = uuid.MustParse(tr.keys[j])
		ops = append(ops, op)
		payoutOf[tr.keys[j]] = true
	}
	b.enqueue(t, ops...)
	b.drain(t)
	to := time.Now().Add(time.Minute)

	// The ledger's keys, roughly in the order CompareTotals reads them (by send time).
	rows, err := b.pool.Query(ctx, `SELECT operation_id::text FROM stepwise_operation WHERE kind = 'payout'
		ORDER BY greatest(last_sent_at, claimed_at), operation_id`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, keys, n)
	require.Equal(t, keys[0][:12], keys[n-1][:12], "a day's dated ids share their start")
	entries, err := bankStatement(b.client).Entries(ctx, from, to)
	require.NoError(t, err)
	byKey := map[string]reconcile.StatementEntry{}
	for _, e := range entries {
		byKey[e.Key] = e
	}
	// Around the edges of the first two batches (255/256, 511/512) and at the ends.
	differs := map[int]bool{0: true, 255: true, 256: true, 511: true, n - 1: true}
	missing := map[int]bool{1: true, 254: true, 257: true, 512: true, n - 2: true}
	var stmt []reconcile.StatementEntry
	for i, k := range keys {
		e, ok := byKey[k]
		require.True(t, ok, "the bank applied %s", k)
		if differs[i] {
			e.Amount++
		}
		if !missing[i] {
			stmt = append(stmt, e)
		}
	}
	neighbours := 0
	for _, tr := range triples {
		for _, k := range tr.keys {
			if !payoutOf[k] {
				stmt = append(stmt, reconcile.StatementEntry{Key: k, ExternalRef: "neighbour", Amount: 1, Currency: "EUR"})
				neighbours++
			}
		}
	}
	// One bucket crowded: thirteen more keys of the first payout's bucket, past the eight a
	// bucket is scanned in order up to.
	crowded := reconcile.KeyBucket(keys[0])
	var buf [36]byte
	copy(buf[:], keys[0])
	for c, added := uint64(0), 0; added < 13; c++ {
		for j, d := 0, c; j < 8; j, d = j+1, d>>4 {
			buf[24+j] = "0123456789abcdef"[d&15]
		}
		if k := string(buf[:]); k != keys[0] && reconcile.KeyBucket(k) == crowded {
			stmt = append(stmt, reconcile.StatementEntry{Key: k, ExternalRef: "crowd", Amount: 1, Currency: "EUR"})
			neighbours++
			added++
		}
	}
	rand.Shuffle(len(stmt), func(i, j int) { stmt[i], stmt[j] = stmt[j], stmt[i] })
	totals, err := reconcile.CompareTotals(ctx, b.pool, reconcile.StatementFunc(func(context.Context, time.Time, time.Time) ([]reconcile.StatementEntry, error) {
		return stmt, nil
	}), &reconcile.TotalsParams{Kind: "payout", From: from, To: to})
	require.NoError(t, err)
	require.Equal(t, n, totals.Here["EUR"].Count)
	require.Equal(t, map[reconcile.DifferenceKind]int{reconcile.DifferenceAmountDiffers: len(differs), reconcile.DifferenceOnlyHere: len(missing),
		reconcile.DifferenceOnlyThere: neighbours}, totals.Counts)
	want := map[reconcile.DifferenceKind][]string{}
	for i := range differs {
		want[reconcile.DifferenceAmountDiffers] = append(want[reconcile.DifferenceAmountDiffers], keys[i])
	}
	for i := range missing {
		want[reconcile.DifferenceOnlyHere] = append(want[reconcile.DifferenceOnlyHere], keys[i])
	}
	got := map[reconcile.DifferenceKind][]string{}
	for _, d := range totals.Differences {
		if d.Kind != reconcile.DifferenceOnlyThere {
			got[d.Kind] = append(got[d.Kind], d.Key)
		}
	}
	for k, list := range want {
		slices.Sort(list)
		require.Equal(t, list, got[k], "%s: each once, in key order", k)
	}
	var there []string
	for _, d := range totals.Differences {
		if d.Kind == reconcile.DifferenceOnlyThere {
			there = append(there, d.Key)
		}
	}
	require.True(t, slices.IsSorted(there), "only there: in key order")
}
