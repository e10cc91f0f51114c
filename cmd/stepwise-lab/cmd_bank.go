package main

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func init() {
	prog.Register("bank", "run the fake bank as a server, with fault flags", runBank)
}

func runBank(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("bank", "bank [--addr 127.0.0.1:8089] [--refuse P] [--error-after P] [--drop-after P] ...", stderr)
	addr := fs.String("addr", "127.0.0.1:8089", "loopback address to listen on (the bank has no authentication)")
	seed := fs.Uint64("seed", 1, "seed of the fault draws")
	latency := fs.Duration("latency", 0, "added to every payment, lookup and statement request")
	delay := fs.Duration("delay", fakebank.DefaultClientTimeout, "how long --delay-after holds an answer")
	strict := fs.Bool("strict", false, "never deduplicate: every payment request that is applied is a new payment, as at a bank that does not remember idempotency keys (the invariants command then sees every second send)")
	var ff bankfake.FaultFlags
	ff.Register(fs, false)
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		return cmdline.UsageError("--addr %q: want host:port, e.g. 127.0.0.1:8089", *addr)
	}
	mix, err := ff.Mix()
	if err != nil {
		return cmdline.UsageError("%v", err)
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
