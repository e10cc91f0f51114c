package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAuditTextOfResolveAndResume: resolve and resume check --actor and --reason with one
// rule before anything runs (exit 2, naming the flag and the character): no control
// characters (a newline forges a second audit line), no invisible or bidi formatting
// characters (U+202E shows "refund 100" as "001 dnufer"). No database is reachable at the
// URL given, so text that is not refused shows up as a connection error (exit 1).
func TestAuditTextOfResolveAndResume(t *testing.T) {
	t.Parallel()
	noDB := []string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}
	op := "00000000-0000-0000-0000-000000000001"
	tests := []struct {
		args []string
		want []string // in stderr
	}{
		{[]string{"resume", "settle/x/0", "--reason", "bank is back", "--actor", "ops\nFORGED line"}, []string{"--actor", "U+000A"}},
		{[]string{"resume", "settle/x/0", "--reason", "bank is back\r\nactor: root", "--actor", "ops"}, []string{"--reason", "U+000D"}},
		{[]string{"resume", "settle/x/0", "--reason", "INC-1 \u202edesrever\u202c", "--actor", "ops"}, []string{"--reason", "U+202E"}},
		{[]string{"resume", "settle/x/0", "--reason", "INC-1", "--actor", "o\u200bps"}, []string{"--actor", "U+200B"}},
		{[]string{"resolve", op, "--to", "SUCCEEDED", "--reason", "TICKET-\u200b1", "--actor", "ops"}, []string{"--reason", "U+200B"}},
		{[]string{"resolve", op, "--to", "SUCCEEDED", "--reason", "TICKET-1 \u2066x\u2069", "--actor", "ops"}, []string{"--reason", "U+2066"}},
	}
	for _, tc := range tests {
		r := runCLI(t, append(tc.args, noDB...)...)
		require.Equal(t, 2, r.code, "%q: %s", tc.args, r.stderr)
		for _, w := range tc.want {
			require.Contains(t, r.stderr, w, "%q", tc.args)
		}
	}
}
