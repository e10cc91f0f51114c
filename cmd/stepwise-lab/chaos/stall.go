package chaos

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/stepwise-go/stepwise/workflowtest"
)

// stallTick is how often a worker process checks that it is being scheduled, stallMin the
// lateness of a tick that it reports as a stall.
const (
	stallTick = 50 * time.Millisecond
	stallMin  = 500 * time.Millisecond
)

// watchStalls reports on w, until ctx ends, every span this process was not scheduled for at
// least stallMin (its ticks came that late): "stalled <from> <duration>", the start in
// RFC 3339 with nanoseconds. A process descheduled by a loaded machine is alive but cannot
// renew its leases or commit; the report is its own measurement of that, for the harness.
func watchStalls(ctx context.Context, w io.Writer) {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if late := now.Sub(last) - stallTick; late >= stallMin {
			fmt.Fprintf(w, "stalled %s %s\n", last.UTC().Format(time.RFC3339Nano), now.Sub(last))
		}
		last = now
	}
}

// stallsIn returns the stalls of at least min that a worker reported in its output lines
// (watchStalls), as spans.
func stallsIn(lines []string, min time.Duration) []workflowtest.Interval {
	var out []workflowtest.Interval
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "stalled" {
			continue
		}
		from, err1 := time.Parse(time.RFC3339Nano, f[1])
		d, err2 := time.ParseDuration(f[2])
		if err1 != nil || err2 != nil || d < min {
			continue
		}
		out = append(out, workflowtest.Interval{From: from, To: from.Add(d)})
	}
	return out
}

// addStalls adds to each worker's life in r the stalls its process reported (workers by pid),
// as paused spans: a process not scheduled for min or longer is as unable to keep its leases
// as a SIGSTOPped one. min is the shortest stall that lets a lease lapse on its own (Lease
// less the heartbeat interval, Lease/3): shorter stalls excuse nothing.
func addStalls(r *workflowtest.ChaosReport, workers *sync.Map, min time.Duration) {
	for i := range r.Workers {
		v, _ := workers.Load(r.Workers[i].Pid)
		w, ok := v.(interface{ Lines() []string })
		if !ok {
			continue
		}
		r.Workers[i].Paused = append(r.Workers[i].Paused, stallsIn(w.Lines(), min)...)
	}
}
