package faultpoint

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConfigureRejectsTypos(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"after-send", "want point:action"},
		{"after-send:explode", `unknown action "explode"`},
		{"after-send:pause=soon", "pause wants a duration"},
		{"after-send:kill@p=2", "probability must be within 0..1"},
		{"after-send:kill@q=1", `unknown qualifier "q"`},
	} {
		err := Configure(tc.spec, "1")
		require.ErrorContains(t, err, tc.want, tc.spec)
		require.ErrorContains(t, err, "STEPWISE_FAULTS rule", "the message names the variable")
	}
	require.ErrorContains(t, Configure("after-send:error", "x"), "STEPWISE_FAULTS_SEED")
}

func TestHitFiresAsConfigured(t *testing.T) {
	t.Cleanup(func() { _ = Configure("", "") })

	require.NoError(t, Configure("", ""))
	require.NoError(t, Hit(AfterSend), "off by default")

	require.NoError(t, Configure("after-send:error@n=3", "1"))
	var fired []int
	for i := 1; i <= 5; i++ {
		if err := Hit(AfterSend); err != nil {
			require.True(t, errors.Is(err, ErrInjected))
			fired = append(fired, i)
		}
	}
	require.Equal(t, []int{3}, fired, "@n=3 fires on the third hit only")
	require.NoError(t, Hit(AfterClaim), "other points stay off")

	require.NoError(t, Configure("after-claim:error@after=2", "1"))
	fired = nil
	for i := 1; i <= 4; i++ {
		if Hit(AfterClaim) != nil {
			fired = append(fired, i)
		}
	}
	require.Equal(t, []int{3, 4}, fired, "@after=2 fires on every hit after the second")

	// The same seed draws the same hits.
	draw := func() (out []bool) {
		require.NoError(t, Configure("after-send:error@p=0.5", "42"))
		for i := 0; i < 32; i++ {
			out = append(out, Hit(AfterSend) != nil)
		}
		return out
	}
	require.Equal(t, draw(), draw())
}
