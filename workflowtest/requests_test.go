package workflowtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// ledgerFixture writes operations and their transitions by hand into a migrated database, so
// that each request-log check meets a history that breaks it (and a twin that does not).
type ledgerFixture struct {
	t    *testing.T
	ctx  context.Context
	base time.Time
}

func (f ledgerFixture) at(ms int) time.Time { return f.base.Add(time.Duration(ms) * time.Millisecond) }

func TestRequestLogChecksFailOnBrokenLogs(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	f := ledgerFixture{t: t, ctx: ctx, base: time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)}
	ins := func(id string, amount int64, state string) {
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, amount, currency, state, next_check_at, lease_until)
			VALUES ($1::uuid, 'payout', $4, '{}', '\x00', $2, 'EUR', $3, now(), now())`, id, amount, state, "bk-"+id)
		require.NoError(t, err)
	}
	event := func(id, from, to, actor string, ms int, manual bool) {
		detail := `{}`
		if manual {
			detail = `{"resolution": "manual"}`
		}
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail, at)
			VALUES ('op:' || $1, 'op.transition', $2, $3, $4, $5::jsonb, $6)`, id, from, to, actor, detail, f.at(ms))
		require.NoError(t, err)
	}
	const (
		good       = "00000000-0000-0000-0000-000000000001"
		concurrent = "00000000-0000-0000-0000-000000000002"
		afterFinal = "00000000-0000-0000-0000-000000000003"
		resolved   = "00000000-0000-0000-0000-000000000004"
		early      = "00000000-0000-0000-0000-000000000005"
		patient    = "00000000-0000-0000-0000-000000000006"
		wrongSum   = "00000000-0000-0000-0000-000000000007"
		stranger   = "00000000-0000-0000-0000-000000000008"
		hasty      = "00000000-0000-0000-0000-000000000009"
	)
	for _, id := range []string{good, concurrent, afterFinal, resolved, early, patient, wrongSum, hasty} {
		ins(id, 100, "SUCCEEDED")
	}
	req := func(id string, amount int64, arrived, decided, ended int, effect bool) workflowtest.Request {
		return workflowtest.Request{OperationID: id, Amount: amount, Arrived: f.at(arrived), Decided: f.at(decided), Ended: f.at(ended), Effect: effect}
	}
	grace := 3 * time.Second
	log := []workflowtest.Request{
		// good: refused once, resent after its not-found and the grace, applied once.
		req(good, 100, 0, 10, 20, false),
		req(good, 100, 3100, 3110, 3120, true),
		// concurrent: the second arrives while the first is still being decided (slow bank).
		req(concurrent, 100, 0, 1500, 1000, false),
		req(concurrent, 100, 1200, 1210, 1220, true),
		// afterFinal: applied, recorded FAILED_PERMANENT at 500 (say by a wrong lookup), sent again at 900.
		req(afterFinal, 100, 0, 10, 20, true),
		req(afterFinal, 100, 900, 910, 920, false),
		// resolved: FAILED_PERMANENT, then a person resolved it back: the send at 900 is theirs.
		req(resolved, 100, 0, 10, 20, false),
		req(resolved, 100, 900, 910, 920, true),
		// early: not-found at 1500, resent at 2000 though the first ended at 1000 (+3s grace).
		req(early, 100, 0, 10, 1000, false),
		req(early, 100, 2000, 2010, 2020, true),
		// patient: the same story with the resend at 4100: fine.
		req(patient, 100, 0, 10, 1000, false),
		req(patient, 100, 4100, 4110, 4120, true),
		// wrongSum: the bank applied 90 for a ledger amount of 100.
		req(wrongSum, 90, 0, 10, 20, true),
		// stranger: an effect no ledger operation explains.
		req(stranger, 100, 0, 10, 20, true),
		// hasty: not-found believed at 1500, 2.5s inside the grace of the request that ended
		// at 1000; resent only at 9000, but the lookup may have raced the first request.
		req(hasty, 100, 0, 10, 1000, false),
		req(hasty, 100, 9000, 9010, 9020, true),
	}
	event(good, "PROCESSING", "RETRYABLE", "dispatcher", 25, false)
	event(good, "PROCESSING", "SUCCEEDED", "dispatcher", 3125, false)
	event(afterFinal, "UNKNOWN_EXTERNAL", "FAILED_PERMANENT", "reconciler", 500, false)
	event(resolved, "PROCESSING", "FAILED_PERMANENT", "dispatcher", 30, false)
	event(resolved, "FAILED_PERMANENT", "PENDING", "alice", 600, true)
	for _, id := range []string{early, hasty} {
		event(id, "PROCESSING", "UNKNOWN_EXTERNAL", "dispatcher", 1001, false)
		event(id, "UNKNOWN_EXTERNAL", "RETRYABLE", "reconciler", 1500, false)
	}
	event(patient, "PROCESSING", "UNKNOWN_EXTERNAL", "dispatcher", 1001, false)
	event(patient, "UNKNOWN_EXTERNAL", "RETRYABLE", "reconciler", 4050, false)

	vs, err := workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{Requests: log, Grace: grace})
	require.NoError(t, err)
	t.Log(workflowtest.FormatViolations(vs))
	got := map[string][]string{}
	for _, v := range vs {
		require.Equal(t, 3, v.Invariant)
		for _, id := range []string{good, concurrent, afterFinal, resolved, early, patient, wrongSum, stranger, hasty} {
			if strings.Contains(v.Evidence, "operation "+id) {
				got[id] = append(got[id], v.Name)
			}
		}
	}
	require.Empty(t, got[good], "a well-behaved history")
	require.Empty(t, got[resolved], "a send after a person resolved the operation back")
	require.Empty(t, got[patient], "a resend after the grace")
	require.Equal(t, []string{"no two requests for one operation_id in flight at once"}, got[concurrent])
	require.Equal(t, []string{"no request after the ledger recorded the operation terminal"}, got[afterFinal])
	require.Equal(t, []string{"not-found is believed, and resent, only after the previous request ended plus the grace period"}, got[early])
	require.Equal(t, []string{"not-found is believed, and resent, only after the previous request ended plus the grace period"}, got[hasty])
	require.Equal(t, []string{"every effect matches exactly one ledger operation with the same amount"}, got[wrongSum])
	require.Equal(t, []string{"every effect matches exactly one ledger operation with the same amount"}, got[stranger])
	require.Len(t, vs, 6)

	// Two effects of one operation: the double payment a deduplicating bank hides.
	twice := append(log[:0:0], req(good, 100, 0, 10, 20, true), req(good, 100, 5000, 5010, 5020, true))
	vs, err = workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{Requests: twice, Grace: grace})
	require.NoError(t, err)
	require.Len(t, vs, 2, workflowtest.FormatViolations(vs)) // after SUCCEEDED at 3125, and twice
	require.Contains(t, workflowtest.FormatViolations(vs), "2 effects at the external system")
}
