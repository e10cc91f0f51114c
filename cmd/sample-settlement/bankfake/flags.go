package bankfake

import (
	"flag"
	"fmt"
	"math"

	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// FaultFlags set a fake bank's fault mix from the command line: the demo's (mild faults by
// default) and "stepwise-lab bank"'s (none by default).
type FaultFlags struct {
	refuse, error5xxBefore, error5xxAfter, dropAfter, delayAfter float64
}

// Register adds --refuse, --error-before, --error-after, --drop-after and --delay-after to fs.
// mild makes the defaults a mild mix (1% refused, 2% 5xx after paying, 2% dropped after
// paying); otherwise every default is 0.
func (f *FaultFlags) Register(fs *flag.FlagSet, mild bool) {
	def := func(v float64) float64 {
		if mild {
			return v
		}
		return 0
	}
	fs.Float64Var(&f.refuse, "refuse", def(0.01), "probability a payment is refused before processing (429, not processed: resent)")
	fs.Float64Var(&f.error5xxBefore, "error-before", 0, "probability of a 500/503 before applying (ambiguous to the caller)")
	fs.Float64Var(&f.error5xxAfter, "error-after", def(0.02), "probability of applying, then answering 500/503 (ambiguous: UNKNOWN_EXTERNAL)")
	fs.Float64Var(&f.dropAfter, "drop-after", def(0.02), "probability of applying, then dropping the connection")
	fs.Float64Var(&f.delayAfter, "delay-after", 0, "probability of applying, then answering after --delay")
}

// Mix returns the fault mix the flags set. Its error names the flag and the range wanted; the
// caller reports it as a usage error.
func (f *FaultFlags) Mix() (fakebank.Mix, error) {
	for _, c := range []struct {
		name string
		v    float64
	}{{"refuse", f.refuse}, {"error-before", f.error5xxBefore}, {"error-after", f.error5xxAfter}, {"drop-after", f.dropAfter}, {"delay-after", f.delayAfter}} {
		// NaN compares false to everything, so a plain range check lets it through.
		if math.IsNaN(c.v) || math.IsInf(c.v, 0) || c.v < 0 || c.v > 1 {
			return fakebank.Mix{}, fmt.Errorf("--%s %v: want a share between 0 and 1, such as 0.01", c.name, c.v)
		}
	}
	m := fakebank.Mix{
		RefuseBeforeApply: f.refuse, Error5xxBeforeApply: f.error5xxBefore, Error5xxAfterApply: f.error5xxAfter,
		DropAfterApply: f.dropAfter, DelayAfterApply: f.delayAfter,
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Errorf("fault flags: %w", err)
	}
	return m, nil
}
