package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The resume command refuses bad input clearly; stepwise.Client.RunResume
// itself is tested in the root and workflow packages.
func TestResumeCommand(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "resume", "--help")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "usage: sample-settlement resume")

	dbURL := seededDBURL(t)
	r = runCLI(t, "resume", "settle/2026-01-01/0", "--actor", "me", "--database-url", dbURL)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--reason is required")

	r = runCLI(t, "resume", "no/such/run", "--reason", "bank is back", "--actor", "me", "--database-url", dbURL)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `run not found: "no/such/run"`)
}
