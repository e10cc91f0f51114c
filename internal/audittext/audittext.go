// Package audittext is the one rule for text a person writes into the audit trail (an
// actor's name, a reason), shared by the client's resolve, workflow.ResumeTx and the console.
//
// The audit trail is read by people, in a browser, a terminal or a report. A control
// character there forges a second line (a newline) or rewrites the terminal (an escape); an
// invisible formatting character changes what the reader sees without changing what was
// written: U+202E (right-to-left override) shows "refund 100" as "001 dnufer", U+200B
// (zero-width space) makes two tickets look the same and compare different. So the rule
// refuses Unicode categories Cc (control), Cf (format: bidi controls, zero-width characters,
// the byte order mark), and the line and paragraph separators (Zl, Zp).
package audittext

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Check reports the first character of s the audit trail cannot hold, or nil. what names
// the text in the message (such as "reason" or "--actor").
func Check(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	for i, r := range s {
		if bad := name(r); bad != "" {
			return fmt.Errorf("%s holds %U (%s) at byte %d: the audit trail keeps plain text on one line, as it was typed; remove it (it is invisible or reorders what a reader sees)",
				what, r, bad, i)
		}
	}
	return nil
}

// name is why r is refused, or "".
func name(r rune) string {
	switch {
	case unicode.IsControl(r):
		return "a control character"
	case unicode.Is(unicode.Cf, r):
		switch {
		case r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069, r == 0x200E, r == 0x200F, r == 0x061C:
			return "a bidirectional formatting character"
		case r == 0xFEFF:
			return "a zero-width no-break space, or byte order mark"
		default:
			return "an invisible formatting character"
		}
	case unicode.In(r, unicode.Zl, unicode.Zp):
		return "a line or paragraph separator"
	}
	return ""
}
