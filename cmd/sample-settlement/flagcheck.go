package main

import (
	"math"
	"time"
	"unicode"
	"unicode/utf8"
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

// checkInt refuses v outside lo..hi, naming the flag and the range.
func checkInt(flagName string, v, lo, hi int) error {
	if v < lo || v > hi {
		return usageError("--%s %d: want %d to %d", flagName, v, lo, hi)
	}
	return nil
}

// checkDuration refuses d outside lo..hi, naming the flag and the range.
func checkDuration(flagName string, d, lo, hi time.Duration) error {
	if d < lo || d > hi {
		return usageError("--%s %s: want %s to %s", flagName, d, lo, hi)
	}
	return nil
}

// checkShare refuses a share that is not a number between 0 and 1 (NaN compares false to
// everything, so a plain range check lets it through).
func checkShare(flagName string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1 {
		return usageError("--%s %v: want a share between 0 and 1, such as 0.01", flagName, v)
	}
	return nil
}

// checkText refuses audit text that is empty, longer than max bytes, not UTF-8, or holds
// control characters (a newline in --actor forges a second line in every log and report
// that prints it).
func checkText(flagName, s string, max int) error {
	switch {
	case len(s) > max:
		return usageError("--%s is %d bytes: keep it within %d (the audit trail keeps every byte, forever)", flagName, len(s), max)
	case !utf8.ValidString(s):
		return usageError("--%s is not valid UTF-8", flagName)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return usageError("--%s holds a control character (%U): use plain text on one line", flagName, r)
		}
	}
	return nil
}
