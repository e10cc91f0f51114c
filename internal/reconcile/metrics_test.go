package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, func(_ *outbox.KindConfig, rk *reconcile.KindConfig) {
		inner := rk.Checker
		rk.Checker = reconcile.CheckerFunc(func(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
			if op.BusinessKey == "erring" {
				return reconcile.LookupResult{}, errors.New("lookup API down")
			}
			return inner.Lookup(ctx, op)
		})
		rk.MaxChecks = 1
	})
	b.unknown(t, payout("found", "a", 1), payout("erring", "b", 2), payout("waiting", "c", 3))
	_, err := b.pool.Exec(ctx, `UPDATE stepwise_operation SET next_check_at = now() + interval '1 hour' WHERE business_key = 'waiting'`)
	require.NoError(t, err)
	_, err = b.rec.RunOnce(ctx, nil)
	require.NoError(t, err)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(b.rec.Metrics()))
	got := gather(t, reg)
	require.Equal(t, 1.0, got[`stepwise_reconcile_lookups_total{kind="payout",result="not_found"}`])
	require.Equal(t, 1.0, got[`stepwise_reconcile_lookups_total{kind="payout",result="error"}`])
	require.Equal(t, 1.0, got[`stepwise_reconcile_unknown{kind="payout"}`], "the one not yet due")
	require.Equal(t, 2.0, got[`stepwise_reconcile_manual{kind="payout"}`], "both checked ones ran out of checks")
	require.Greater(t, got[`stepwise_reconcile_oldest_unknown_seconds{kind="payout"}`], 0.0)
}

// gather scrapes reg into "name{label="value",...}" -> value.
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
			k := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[k] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[k] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	sender := outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil })
	ob, err := outbox.New(pool, &outbox.Config{Kinds: map[string]*outbox.KindConfig{"payout": {Sender: sender, Timeout: 30 * time.Second}}})
	require.NoError(t, err)
	q := reconcile.CheckerFunc(func(context.Context, *outbox.Operation) (reconcile.LookupResult, error) {
		return reconcile.LookupResult{}, nil
	})
	cases := []struct {
		name string
		cfg  *reconcile.Config
		want string
	}{
		{"no outbox", &reconcile.Config{Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: q}}}, "Config.Outbox is nil"},
		{"no kinds", &reconcile.Config{Outbox: ob}, "Config.Kinds is empty"},
		{"no checker", &reconcile.Config{Outbox: ob, Kinds: map[string]*reconcile.KindConfig{"payout": {}}}, `Kinds["payout"].Checker is nil`},
		{"kind not in the outbox", &reconcile.Config{Outbox: ob, Kinds: map[string]*reconcile.KindConfig{"refund": {Checker: q}}}, "the Outbox has no such kind"},
		{"grace not past the send timeout", &reconcile.Config{Outbox: ob, Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: q, Grace: 30 * time.Second}}},
			"Grace 30s is not longer than its send Timeout 30s"},
		{"fast interval", &reconcile.Config{Outbox: ob, Interval: time.Millisecond, Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: q}}}, "Interval"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reconcile.New(pool, tc.cfg)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = reconcile.New(pool, &reconcile.Config{Outbox: ob, Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: q}}})
	require.NoError(t, err)
}
