package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	cases := []struct {
		name string
		err  error
		want outbox.State
	}{
		{"success", nil, outbox.StateSucceeded},
		{"permanent", outbox.Permanent(errors.New("declined")), outbox.StateFailedPermanent},
		{"permanent, wrapped", fmt.Errorf("pay: %w", outbox.Permanent(errors.New("declined"))), outbox.StateFailedPermanent},
		{"not sent", outbox.NotSent(errors.New("429 not processed")), outbox.StateRetryable},
		{"not sent, wrapped", fmt.Errorf("pay: %w", outbox.NotSent(errors.New("dial refused"))), outbox.StateRetryable},
		{"permanent wins over not sent", outbox.Permanent(outbox.NotSent(errors.New("x"))), outbox.StateFailedPermanent},
		{"timeout", context.DeadlineExceeded, outbox.StateUnknownExternal},
		{"cancelled", context.Canceled, outbox.StateUnknownExternal},
		{"connection reset", reset, outbox.StateUnknownExternal},
		{"EOF", io.ErrUnexpectedEOF, outbox.StateUnknownExternal},
		{"ambiguous 5xx", errors.New("503 Service Unavailable"), outbox.StateUnknownExternal},
		{"unclassified", errors.New("something odd"), outbox.StateUnknownExternal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, outbox.Classify(tc.err))
		})
	}
	require.True(t, outbox.IsPermanent(outbox.Permanent(io.EOF)))
	require.True(t, errors.Is(outbox.NotSent(io.EOF), io.EOF), "the marks unwrap")
}

func TestStateMachine(t *testing.T) {
	t.Parallel()
	allowed := map[outbox.State][]outbox.State{
		outbox.StatePending:         {outbox.StateProcessing},
		outbox.StateRetryable:       {outbox.StateProcessing},
		outbox.StateProcessing:      {outbox.StateSucceeded, outbox.StateFailedPermanent, outbox.StateRetryable, outbox.StateUnknownExternal, outbox.StateManual},
		outbox.StateUnknownExternal: {outbox.StateSucceeded, outbox.StateFailedPermanent, outbox.StateRetryable, outbox.StateManual},
		outbox.StateManual:          {outbox.StateSucceeded, outbox.StateFailedPermanent, outbox.StateRetryable},
	}
	for _, from := range outbox.States() {
		for _, to := range outbox.States() {
			want := false
			for _, s := range allowed[from] {
				want = want || s == to
			}
			require.Equal(t, want, outbox.CanTransition(from, to), "%s -> %s", from, to)
		}
	}
	require.True(t, outbox.StateSucceeded.Terminal())
	require.True(t, outbox.StateFailedPermanent.Terminal())
	require.False(t, outbox.StateManual.Terminal(), "MANUAL waits for a person")
}

func TestDefaultRetryBackoff(t *testing.T) {
	t.Parallel()
	for attempt, base := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second, 40: 10 * time.Minute} {
		for range 50 {
			d := outbox.DefaultRetryBackoff(attempt)
			require.GreaterOrEqual(t, d, base*3/4, "attempt %d", attempt)
			require.LessOrEqual(t, d, base*5/4, "attempt %d", attempt)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	sender := &scriptSender{}
	cases := []struct {
		name string
		cfg  *outbox.Config
		want string
	}{
		{"no kinds", &outbox.Config{}, "Config.Kinds is empty"},
		{"bad kind name", &outbox.Config{Kinds: map[string]*outbox.KindConfig{"Pay Out": {Sender: sender}}}, `kind "Pay Out"`},
		{"nil kind", &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": nil}}, `Kinds["payout"] is nil`},
		{"no sender", &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": {}}}, `Kinds["payout"].Sender is nil`},
		{"two callbacks", &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender,
			OnOutcome:      func(context.Context, pgx.Tx, *outbox.Operation, outbox.Outcome) error { return nil },
			OnOutcomeBatch: func(context.Context, pgx.Tx, []outbox.OperationOutcome) error { return nil }}}}, "keep one"},
		{"short lease", &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender, Lease: time.Millisecond}}}, "Lease 1ms"},
		{"negative rate", &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender, RatePerSecond: -1}}}, "RatePerSecond"},
		{"fast poll", &outbox.Config{PollInterval: time.Millisecond, Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender}}}, "PollInterval"},
		{"lease not longer than timeout", &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender, Timeout: 30 * time.Second, Lease: 30 * time.Second}}},
			`Kinds["payout"].Lease 30s is not longer than Timeout 30s`},
		{"short dispatcher lease", &outbox.Config{DispatcherLease: 100 * time.Millisecond, Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender}}},
			"Config.Outbox.DispatcherLease 100ms: want at least 1s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := outbox.New(pool, tc.cfg)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	ob, err := outbox.New(pool, &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender}}})
	require.NoError(t, err)
	kc := ob.KindConfig("payout")
	require.Equal(t, 200, kc.BatchSize)
	require.Equal(t, 16, kc.Concurrency)
	require.Equal(t, 30*time.Second, kc.Timeout)
	require.Equal(t, time.Minute, kc.Lease)
	require.Equal(t, 25, kc.MaxAttempts)
	rc := &river.Config{}
	require.NoError(t, ob.Install(rc))
	require.NoError(t, ob.Register(context.Background()))
	require.Equal(t, map[string]int{"stepwise_outbox": 2, "stepwise_outbox_payout": 2}, func() map[string]int {
		out := map[string]int{}
		for name, q := range rc.Queues {
			out[name] = q.MaxWorkers
		}
		return out
	}())
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	ob := newOutbox(t, pool, &scriptSender{}, nil)
	enqueue(t, pool, outboxOp("ok"), outboxOp("unclassified"), outboxOp("pending-later"))
	_, err := pool.Exec(ctx, `UPDATE stepwise_operation SET next_attempt_at = now() + interval '1 hour' WHERE business_key = 'pending-later'`)
	require.NoError(t, err)
	_, err = ob.Drain(ctx, "payout")
	require.NoError(t, err)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(ob.Metrics()))
	got := gather(t, reg)
	require.Equal(t, 1.0, got[`stepwise_outbox_operations{kind="payout",state="PENDING"}`])
	require.Equal(t, 1.0, got[`stepwise_outbox_operations{kind="payout",state="UNKNOWN_EXTERNAL"}`])
	require.Contains(t, got, `stepwise_outbox_operations{kind="payout",state="MANUAL"}`, "zero is reported, not left out")
	require.Equal(t, 1.0, got[`stepwise_outbox_sends_total{kind="payout",result="succeeded"}`])
	require.Equal(t, 1.0, got[`stepwise_outbox_sends_total{kind="payout",result="unknown_external"}`])
	require.Equal(t, 2.0, got[`stepwise_outbox_claimed_total{kind="payout"}`])
	require.Equal(t, 1.0, got[`stepwise_outbox_transitions_total{from="PROCESSING",kind="payout",to="SUCCEEDED"}`])
	require.Greater(t, got[`stepwise_outbox_oldest_unknown_seconds{kind="payout"}`], 0.0)
}

// gather scrapes reg into "name{label="value",...}" -> value (counters, gauges).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func outboxOp(key string) outbox.EnqueueParams {
	return outbox.EnqueueParams{Kind: "payout", BusinessKey: key}
}
