package main

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// The built command, as "go install .../cmd/stepwise@version" leaves it, in a real process:
// the exit codes a script branches on are the process's.
func TestBinaryExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command; skipped with -short")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "stepwise")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	db := testkit.DBURL(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{nil, 2},
		{[]string{"help"}, 0},
		{[]string{"runs", "--help"}, 0},
		{[]string{"runs", "--database-url", db}, 0},
		{[]string{"runs", "show", "no/such/run", "--database-url", db}, 3},
		{[]string{"runs", "--status", "stuck", "--database-url", db}, 2},
		{[]string{"prune", "--older-than", "48h", "--failed-run", "nope", "--database-url", db}, 1},
	} {
		cmd := exec.Command(bin, tc.args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else {
			require.NoError(t, err)
		}
		t.Logf("$ stepwise %q -> %d\n%s%s", redactArgs(tc.args), code, stdout.String(), stderr.String())
		require.Equal(t, tc.code, code, "%q", tc.args)
	}
}
