package main

import (
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
)

// Bounds of numeric flags. Guards against: a value that panics (a slice of 2^63 elements), a
// zero silently replaced by a default (--shards 0 became 4, so a typo changed every process's
// plan), a negative duration taken as "no time at all", and a value large enough to exhaust
// memory or the database (a 10^8 batch in one transaction).
const (
	maxMerchants    = 10_000_000
	maxTransactions = 50_000_000
	maxBatchSize    = 100_000
	maxShards       = 1024
	maxWorkers      = 1024
	maxConcurrency  = 4096
	maxReasonLen    = 2000
	maxActorLen     = 200
)

// checkShare refuses a share that is not a number between 0 and 1 (NaN compares false to
// everything, so a plain range check lets it through).
func checkShare(flagName string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1 {
		return cmdline.UsageError("--%s %v: want a share between 0 and 1, such as 0.01", flagName, v)
	}
	return nil
}

// checkText refuses audit text that is longer than max bytes, not UTF-8, or holds a
// character that makes the audit trail read otherwise than it was written: control
// characters (a newline in --actor forges a second line in every log and report that prints
// it), invisible and bidirectional formatting characters (Unicode Cf: U+202E shows "refund
// 100" as "001 dnufer", U+200B makes two tickets look alike), line and paragraph separators.
// The same rule as the client's OperationResolve and RunResume; every command that writes audit
// text (resolve, resume) checks its flags with it before anything runs.
func checkText(flagName, s string, max int) error {
	switch {
	case len(s) > max:
		return cmdline.UsageError("--%s is %d bytes: keep it within %d (the audit trail keeps every byte, forever)", flagName, len(s), max)
	case !utf8.ValidString(s):
		return cmdline.UsageError("--%s is not valid UTF-8", flagName)
	}
	for _, r := range s {
		switch {
		case unicode.IsControl(r), unicode.In(r, unicode.Zl, unicode.Zp):
			return cmdline.UsageError("--%s holds a control character or line break (%U): use plain text on one line", flagName, r)
		case unicode.Is(unicode.Cf, r):
			return cmdline.UsageError("--%s holds an invisible or bidirectional formatting character (%U): it would make the audit trail read otherwise than typed; remove it", flagName, r)
		}
	}
	return nil
}

// checkAuditFlags checks the actor and the reason of a command that writes the audit trail:
// both required, both by checkText.
func checkAuditFlags(actor, reason string) error {
	if strings.TrimSpace(reason) == "" {
		return cmdline.UsageError("--reason is required: it is kept in the audit trail")
	}
	if strings.TrimSpace(actor) == "" {
		return cmdline.UsageError("--actor is required when $USER is not set")
	}
	if err := checkText("reason", reason, maxReasonLen); err != nil {
		return err
	}
	return checkText("actor", actor, maxActorLen)
}
