package faultpoint

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// helperEnv makes the test binary, re-executed by TestProductionIgnoresEnvironment, run
// only TestHelperHitInChild and report what Hit did.
const helperEnv = "FAULTPOINT_TEST_HELPER"

// A production binary that imports Stepwise must ignore STEPWISE_FAULTS: a stray variable in
// a deployment must neither kill the service at a fault point nor (with a typo) stop it from
// starting. A real process is started with the variable set and never calls ArmFromEnv.
func TestProductionIgnoresEnvironment(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	for _, spec := range []string{"after-send:error", "after-send:kill", "after-send:explode"} {
		cmd := exec.Command(exe, "-test.run=^TestHelperHitInChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"=1", Env+"="+spec)
		out, err := cmd.CombinedOutput()
		t.Logf("child with %s=%s: err=%v\n%s", Env, spec, err, out)
		require.NoError(t, err, "STEPWISE_FAULTS=%s must be ignored by a process that did not arm faults", spec)
		require.Contains(t, string(out), "hit: <nil>")
	}
}

// TestHelperHitInChild runs only in the child of TestProductionIgnoresEnvironment.
func TestHelperHitInChild(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper of TestProductionIgnoresEnvironment")
	}
	err := Hit(AfterSend)
	fmt.Printf("hit: %v\n", err)
	require.NoError(t, err)
}

// Test code arms faults from the environment explicitly, and a typo is an error then.
func TestArmFromEnv(t *testing.T) {
	t.Cleanup(func() { _ = Configure("", "") })
	t.Setenv(Env, "after-send:error")
	t.Setenv(SeedEnv, "1")
	require.NoError(t, ArmFromEnv())
	require.ErrorIs(t, Hit(AfterSend), ErrInjected)
	t.Setenv(Env, "after-send:explode")
	require.ErrorContains(t, ArmFromEnv(), "STEPWISE_FAULTS rule")
}
