package fakebank

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStrictNeverDeduplicates: in strict mode a second request under one key is a second
// payment, counted everywhere a test looks (Effects, Applied, the statement, the request log),
// while the default mode still absorbs it: the twin that shows strict mode is what changes it.
func TestStrictNeverDeduplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, strict := range []bool{false, true} {
		bank, bundle := setup(t, &Config{Strict: strict})
		first, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 1250))
		require.NoError(t, err)
		second, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 1250))
		require.NoError(t, err)
		log := bank.Requests()
		require.Len(t, log, 2)
		for i, r := range log {
			require.Equal(t, "op-1", r.OperationID)
			require.Equal(t, int64(1250), r.Amount)
			require.False(t, r.Arrived.IsZero() || r.Decided.IsZero() || r.Answered.IsZero(), "request %d: %+v", i, r)
			require.True(t, r.Abandoned.IsZero())
			require.Equal(t, r.Answered, r.Ended())
		}
		if !strict {
			require.Equal(t, first.ID, second.ID)
			require.Equal(t, 1, bank.Effects("op-1"))
			require.Equal(t, OutcomeReplayed, log[1].Outcome)
			require.False(t, log[1].Effect)
			continue
		}
		require.NotEqual(t, first.ID, second.ID)
		require.Equal(t, 2, bank.Effects("op-1"))
		require.Len(t, bank.Applied(), 2)
		require.Len(t, bank.Statement(StatementQuery{}), 2)
		require.Equal(t, OutcomeApplied, log[1].Outcome)
		require.True(t, log[0].Effect && log[1].Effect)
		// A lookup finds the first payment; the log is served to other processes too.
		found, err := bundle.client.Lookup(ctx, "op-1")
		require.NoError(t, err)
		require.Equal(t, first.ID, found.ID)
		remote, err := bundle.client.Requests(ctx)
		require.NoError(t, err)
		require.Len(t, remote, 2)
		require.Equal(t, second.ID, remote[1].PaymentID)
	}
}

// TestSlowRequestAppliesAfterTheCallerGaveUp: a slow request outlives the caller's timeout and
// is applied anyway; the log shows when the caller hung up and when the bank decided.
func TestSlowRequestAppliesAfterTheCallerGaveUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank := New(&Config{Strict: true, Profile: LatencyProfile{Slow: 1, SlowMin: 400 * time.Millisecond, SlowMax: 400 * time.Millisecond}})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { require.NoError(t, bank.Close()) })
	client := NewClient(bank.URL(), &http.Client{Timeout: 100 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}})

	_, err := client.Pay(ctx, "op-slow", payReq("settle-1", 700))
	require.Error(t, err, "the caller times out")
	require.Eventually(t, func() bool { return bank.Effects("op-slow") == 1 }, 5*time.Second, 10*time.Millisecond,
		"the bank applies the slow request after the caller left")
	r := bank.Requests()[0]
	require.Equal(t, OutcomeApplied, r.Outcome)
	require.False(t, r.Abandoned.IsZero(), "the caller's hang-up is recorded: %+v", r)
	require.Equal(t, r.Abandoned, r.Ended())
	require.GreaterOrEqual(t, r.Decided.Sub(r.Arrived), 400*time.Millisecond)
	require.True(t, r.Abandoned.Before(r.Decided), "hung up %s, decided %s", r.Abandoned, r.Decided)
}

// TestStallAppliesAtOnce: a stalled request is applied on arrival and its answer held back.
func TestStallAppliesAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank := New(&Config{Strict: true, Profile: LatencyProfile{Stall: 1, StallFor: 5 * time.Second}})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { require.NoError(t, bank.Close()) })
	client := NewClient(bank.URL(), &http.Client{Timeout: 200 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}})

	_, err := client.Pay(ctx, "op-stall", payReq("settle-1", 700))
	require.Error(t, err)
	require.Equal(t, 1, bank.Effects("op-stall"))
	require.Eventually(t, func() bool { return !bank.Requests()[0].Abandoned.IsZero() }, 5*time.Second, 10*time.Millisecond)
	r := bank.Requests()[0]
	require.Less(t, r.Decided.Sub(r.Arrived), 200*time.Millisecond)
	require.Equal(t, 5*time.Second, r.Stall)
}

func TestLatencyProfileValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, ProfileSlow(time.Second).Validate())
	require.NoError(t, ProfileStalls(time.Second).Validate())
	require.ErrorContains(t, LatencyProfile{Slow: 0.7, Stall: 0.7, StallFor: time.Second}.Validate(), "sum to more than 1")
	require.ErrorContains(t, LatencyProfile{Stall: 0.1}.Validate(), "StallFor")
	require.ErrorContains(t, LatencyProfile{Slow: 0.1, SlowMin: time.Second}.Validate(), "ordered")
}

// TestClientNeverResendsByItself: net/http replays a request carrying an Idempotency-Key when
// a reused keep-alive connection dies before the answer. Against a bank that does not
// deduplicate that is a second payment nobody decided; the client must leave resending to the
// operation ledger.
func TestClientNeverResendsByItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank := New(&Config{Strict: true})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { require.NoError(t, bank.Close()) })
	tr := &http.Transport{} // keep-alive on, as in production
	t.Cleanup(tr.CloseIdleConnections)
	client := NewClient(bank.URL(), &http.Client{Timeout: 2 * time.Second, Transport: tr})

	_, err := client.Pay(ctx, "warm-up", payReq("settle-0", 100)) // leaves a connection to reuse
	require.NoError(t, err)
	bank.FailKey("op-drop", DropAfterApply)
	_, err = client.Pay(ctx, "op-drop", payReq("settle-1", 100))
	require.Error(t, err, "a dropped connection is ambiguous")
	require.Len(t, RequestsFor(bank.Requests(), "op-drop"), 1, "the client sent the payment again by itself")
	require.Equal(t, 1, bank.Effects("op-drop"))
}
