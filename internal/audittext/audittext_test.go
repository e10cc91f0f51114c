package audittext_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/audittext"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{"", "TICKET-7: the bank confirms 999 EUR", "Zoë Müller-Łukasiewicz", "支払い確認済み", "مرحبا", "👍🏽 ok"} {
		require.NoError(t, audittext.Check("reason", ok), "%q", ok)
	}
	for s, want := range map[string]string{
		"a\nb":             "U+000A",
		"a\x00b":           "U+0000",
		"a\x1b[2Jb":        "U+001B",
		"a\u0085b":         "U+0085",
		"refund \u202e001": "U+202E (a bidirectional formatting character)",
		"x\u2066y\u2069":   "U+2066",
		"TICKET-\u200b1":   "U+200B (an invisible formatting character)",
		"a\u200db":         "U+200D",
		"\ufeffa":          "U+FEFF",
		"a\u00adb":         "U+00AD",
		"a\u2028b":         "U+2028 (a line or paragraph separator)",
		"a\u2029b":         "U+2029",
		"a\xffb":           "not valid UTF-8",
	} {
		err := audittext.Check("reason", s)
		require.Error(t, err, "%q", s)
		require.Contains(t, err.Error(), want)
		require.Contains(t, err.Error(), "reason")
	}
}
