package main

import (
	"context"
	"errors"
	"io"
	"strings"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/stepwise-lab/bench"
)

func init() {
	prog.Register("bench", "measure Stepwise against the plain-pgx floor and River one-job-per-merchant; delivery, reconcile, takeover, scale, size", runBench)
}

// runBench is bench.Main with its command-line mistakes exiting 2, as every command's do. The
// bench's worker processes (takeover, scale) re-execute this binary's bench command; bench.Main
// tells them apart by their environment.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := bench.Main(ctx, args, stdout, stderr)
	if errors.Is(err, bench.ErrUsage) {
		return cmdline.UsageError("%s", strings.TrimPrefix(err.Error(), "bench: "))
	}
	return err
}
