package workflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestTraceOfASettleWithALostAnswer settles 250 merchants (the package example's SettleWorker)
// with the bank's answer to one payout lost after it paid, every component given an SDK
// TracerProvider with the in-memory exporter, and checks the exported span tree: the start;
// attempts linked to it; their claims and steps (run key, number, token, items); an enqueue
// under each step that settled merchants; 250 sends, each linked to the step that enqueued
// its payout, the lost one's outcome UNKNOWN_EXTERNAL; and the reconciler's check of that one,
// linked to the same step, deciding SUCCEEDED. Guards against: a send or check an operator
// cannot trace back to the step that caused it (the traceparent not stored with the
// operation, or not read back), and spans without the attributes the design names.
func TestTraceOfASettleWithALostAnswer(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `
		CREATE TABLE merchant (id bigint PRIMARY KEY);
		INSERT INTO merchant SELECT generate_series(1, 250);
		CREATE TABLE settlement (merchant_id bigint, settle_date date, PRIMARY KEY (merchant_id, settle_date));`)
	require.NoError(t, err)

	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	bank := fakebank.New(&fakebank.Config{Strict: true})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	lost := outbox.OperationID(PayoutKind, "2026-11-29/7")
	bank.FailKey(lost.String(), fakebank.Error5xxAfterApply)
	bankClient := fakebank.NewClient(bank.URL(), nil)
	quiet := slog.New(slog.DiscardHandler)

	engine, err := workflow.New(pool, &workflow.Config{Lease: 10 * time.Second, Logger: quiet, TracerProvider: tp})
	require.NoError(t, err)
	ob, err := outbox.New(pool, &outbox.Config{Logger: quiet, TracerProvider: tp, Kinds: map[string]*outbox.KindConfig{
		PayoutKind: {Sender: fakebank.Sender{Client: bankClient}},
	}})
	require.NoError(t, err)
	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: ob, Logger: quiet, Interval: time.Second, TracerProvider: tp,
		Kinds: map[string]*reconcile.KindConfig{PayoutKind: {Checker: fakebank.Checker{Client: bankClient}}}})
	require.NoError(t, err)
	rc := &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: river.NewWorkers(),
		Logger:  quiet,
	}
	require.NoError(t, workflow.AddWorkerSafely(engine, rc.Workers, &SettleWorker{}))
	for _, install := range []func(*river.Config) error{engine.Install, ob.Install, rec.Install} {
		require.NoError(t, install(rc))
	}
	require.NoError(t, ob.Register(ctx))
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	require.NoError(t, client.Start(context.WithoutCancel(ctx)))
	maintCtx, stopMaintenance := context.WithCancel(ctx)
	go engine.RunMaintenance(maintCtx, client) //nolint:errcheck
	go ob.RunMaintenance(maintCtx, client)     //nolint:errcheck
	go rec.RunMaintenance(maintCtx, client)    //nolint:errcheck

	const key = "settle/2026-11-29"
	_, err = workflow.Start(ctx, client, key, SettleArgs{Date: "2026-11-29"}, &workflow.StartOpts{TracerProvider: tp})
	require.NoError(t, err)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		run, err := workflow.GetRun(ctx, pool, key)
		require.NoError(t, err)
		n, err := outbox.UnfinishedForRuns(ctx, pool, key)
		require.NoError(t, err)
		if run.Status == workflow.RunStatusSucceeded && n == 0 {
			break
		}
		require.NotEqual(t, workflow.RunStatusFailed, run.Status)
		require.True(t, time.Now().Before(deadline), "run %s with %d payouts unfinished after 2 minutes", run.Status, n)
		time.Sleep(50 * time.Millisecond)
	}
	op, err := outbox.Get(ctx, pool, lost)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, op.State)
	require.NotEmpty(t, op.TraceParent, "the operation carries the traceparent of the step that enqueued it")

	stopMaintenance()
	engine.Quiesce()
	ob.Quiesce()
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, client.Stop(stopCtx))

	spans := exporter.GetSpans()
	byName := map[string][]tracetest.SpanStub{}
	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
		byID[s.SpanContext.SpanID()] = s
	}
	attr := func(s tracetest.SpanStub, k string) attribute.Value {
		for _, kv := range s.Attributes {
			if string(kv.Key) == k {
				return kv.Value
			}
		}
		return attribute.Value{}
	}
	linkedTo := func(s tracetest.SpanStub, target trace.SpanContext) bool {
		return slices.ContainsFunc(s.Links, func(l sdktrace.Link) bool {
			return l.SpanContext.TraceID() == target.TraceID() && l.SpanContext.SpanID() == target.SpanID()
		})
	}
	summary := func() string {
		var b strings.Builder
		for name, ss := range byName {
			fmt.Fprintf(&b, "%s×%d ", name, len(ss))
		}
		return b.String()
	}

	// Start: one root span, whose context rides in the job's metadata.
	require.Len(t, byName["stepwise.start"], 1, summary())
	start := byName["stepwise.start"][0]
	require.False(t, start.Parent.IsValid(), "the start is the root of the caller's trace here")
	require.Equal(t, key, attr(start, "stepwise.run.key").AsString())
	require.True(t, attr(start, "stepwise.run.created").AsBool())

	// Attempts of the run, each linked to the start (they run later, in River's worker).
	var attempts []tracetest.SpanStub
	for _, a := range byName["stepwise.attempt"] {
		if attr(a, "stepwise.run.key").AsString() == key {
			require.True(t, linkedTo(a, start.SpanContext), "attempt %s not linked to the start", a.SpanContext.SpanID())
			attempts = append(attempts, a)
		}
	}
	require.NotEmpty(t, attempts, summary())
	isAttempt := func(id trace.SpanID) bool {
		return slices.ContainsFunc(attempts, func(a tracetest.SpanStub) bool { return a.SpanContext.SpanID() == id })
	}

	// Claims under the attempts.
	claimed := 0
	for _, c := range byName["stepwise.claim"] {
		require.True(t, isAttempt(c.Parent.SpanID()), "claim outside an attempt")
		if attr(c, "stepwise.claim.outcome").AsString() == "claimed" {
			claimed++
			require.Positive(t, attr(c, "stepwise.token").AsInt64())
		}
	}
	require.Positive(t, claimed)

	// Steps 1..4 under the attempts: 100, 100, 50 merchants, then the empty step that ends it.
	steps := map[int64]tracetest.SpanStub{}
	for _, s := range byName["stepwise.step"] {
		require.True(t, isAttempt(s.Parent.SpanID()), "step outside an attempt")
		require.Equal(t, key, attr(s, "stepwise.run.key").AsString())
		require.Positive(t, attr(s, "stepwise.token").AsInt64())
		steps[attr(s, "stepwise.step").AsInt64()] = s
	}
	require.Len(t, steps, 4, summary())
	for n, items := range map[int64]int64{1: 100, 2: 100, 3: 50, 4: 0} {
		require.Equal(t, items, attr(steps[n], "stepwise.step.items").AsInt64(), "items of step %d", n)
	}
	require.Equal(t, "done", attr(steps[4], "stepwise.step.next").AsString())

	// An enqueue under each of the first three steps.
	enqueuedBy := map[trace.SpanID]bool{}
	for _, e := range byName["stepwise.enqueue"] {
		parent, ok := byID[e.Parent.SpanID()]
		require.True(t, ok && parent.Name == "stepwise.step", "enqueue outside a step")
		enqueuedBy[parent.SpanContext.SpanID()] = true
	}
	for n := int64(1); n <= 3; n++ {
		require.True(t, enqueuedBy[steps[n].SpanContext.SpanID()], "no enqueue under step %d", n)
	}

	// 250 sends, each linked to the step that enqueued its payout, in a trace of its own; the
	// lost answer's class is UNKNOWN_EXTERNAL.
	stepOf := func(merchant int) tracetest.SpanStub { return steps[int64((merchant-1)/100+1)] }
	sends := byName["stepwise.send"]
	require.Len(t, sends, 250, summary())
	var lostSend *tracetest.SpanStub
	for i, s := range sends {
		bk := attr(s, "stepwise.operation.business_key").AsString()
		var merchant int
		_, err := fmt.Sscanf(bk, "2026-11-29/%d", &merchant)
		require.NoError(t, err, bk)
		step := stepOf(merchant)
		require.True(t, linkedTo(s, step.SpanContext), "send of %s not linked to step %d", bk, attr(step, "stepwise.step").AsInt64())
		require.NotEqual(t, step.SpanContext.TraceID(), s.SpanContext.TraceID(), "a send is in the dispatcher's trace, not the step's")
		require.Equal(t, PayoutKind, attr(s, "stepwise.operation.kind").AsString())
		if attr(s, "stepwise.operation.id").AsString() == lost.String() {
			lostSend = &sends[i]
			continue
		}
		require.Equal(t, string(outbox.StateSucceeded), attr(s, "stepwise.send.outcome").AsString(), bk)
	}
	require.NotNil(t, lostSend)
	require.Equal(t, string(outbox.StateUnknownExternal), attr(*lostSend, "stepwise.send.outcome").AsString())

	// The reconciler's check of the lost one, linked to the same step, decides SUCCEEDED after
	// the send.
	var checks []tracetest.SpanStub
	for _, c := range byName["stepwise.check"] {
		if attr(c, "stepwise.operation.id").AsString() == lost.String() {
			checks = append(checks, c)
		}
	}
	require.NotEmpty(t, checks, summary())
	last := checks[len(checks)-1]
	require.True(t, linkedTo(last, stepOf(7).SpanContext), "check not linked to the step that enqueued the payout")
	require.Equal(t, string(outbox.StateSucceeded), attr(last, "stepwise.check.decided").AsString())
	require.Equal(t, "succeeded", attr(last, "stepwise.check.result").AsString())
	require.True(t, last.StartTime.After(lostSend.EndTime), "the check comes after the send")
}
