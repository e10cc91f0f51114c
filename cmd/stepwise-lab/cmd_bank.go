package main

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func init() {
	register("bank", "run the fake bank as a server, with fault flags", runBank)
}

// faultFlags set a fakebank fault mix from the command line.
type faultFlags struct {
	refuse, error5xxBefore, error5xxAfter, dropAfter, delayAfter float64
}

func (f *faultFlags) register(fs interface {
	Float64Var(*float64, string, float64, string)
}, mild bool) {
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

func (f *faultFlags) mix() (fakebank.Mix, error) {
	for _, c := range []struct {
		name string
		v    float64
	}{{"refuse", f.refuse}, {"error-before", f.error5xxBefore}, {"error-after", f.error5xxAfter}, {"drop-after", f.dropAfter}, {"delay-after", f.delayAfter}} {
		if err := checkShare(c.name, c.v); err != nil {
			return fakebank.Mix{}, err
		}
	}
	m := fakebank.Mix{
		RefuseBeforeApply: f.refuse, Error5xxBeforeApply: f.error5xxBefore, Error5xxAfterApply: f.error5xxAfter,
		DropAfterApply: f.dropAfter, DelayAfterApply: f.delayAfter,
	}
	if err := m.Validate(); err != nil {
		return m, usageError("fault flags: %v", err)
	}
	return m, nil
}

func runBank(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bank", "bank [--addr 127.0.0.1:8089] [--refuse P] [--error-after P] [--drop-after P] ...", stderr)
	addr := fs.String("addr", "127.0.0.1:8089", "loopback address to listen on (the bank has no authentication)")
	seed := fs.Uint64("seed", 1, "seed of the fault draws")
	latency := fs.Duration("latency", 0, "added to every payment, lookup and statement request")
	delay := fs.Duration("delay", fakebank.DefaultClientTimeout, "how long --delay-after holds an answer")
	strict := fs.Bool("strict", false, "never deduplicate: every payment request that is applied is a new payment, as at a bank that does not remember idempotency keys (the invariants command then sees every second send)")
	var ff faultFlags
	ff.register(fs, false)
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		return usageError("--addr %q: want host:port, e.g. 127.0.0.1:8089", *addr)
	}
	mix, err := ff.mix()
	if err != nil {
		return err
	}
	bank := fakebank.New(&fakebank.Config{Addr: *addr, Seed: *seed, Latency: *latency, Delay: *delay, Faults: mix, Strict: *strict})
	if err := bank.Start(); err != nil {
		return err
	}
	defer bank.Close()
	fmt.Fprintf(stdout, "bank listening on %s (strict %v; faults: refuse %.3g, error-before %.3g, error-after %.3g, drop-after %.3g, delay-after %.3g)\n",
		bank.URL(), *strict, mix.RefuseBeforeApply, mix.Error5xxBeforeApply, mix.Error5xxAfterApply, mix.DropAfterApply, mix.DelayAfterApply)
	<-ctx.Done()
	st := bank.Stats()
	fmt.Fprintf(stdout, "bank stopping: %d requests, %d applied (%d declined), %d replays, faults %v\n",
		st.Requests, st.Applied, st.Declined, st.Replays, st.Faults)
	return bank.Close()
}
