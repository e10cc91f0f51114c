package main

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// TestDemoExportsOTLPTraces runs the demo with OTEL_EXPORTER_OTLP_ENDPOINT pointing at an
// OTLP/HTTP receiver and checks that the spans arrive: River's work spans (otelriver) and
// Stepwise's start, step, enqueue and send spans, under the service name sample-settlement.
// Without the variable the demo exports nothing (every other test runs that way). Not
// parallel: it sets the environment and otel's global provider.
func TestDemoExportsOTLPTraces(t *testing.T) {
	var (
		mu      sync.Mutex
		names   = map[string]int{}
		service string
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		raw, err := io.ReadAll(body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if err == nil {
			err = proto.Unmarshal(raw, req)
		}
		if r.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names[s.Name]++
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer receiver.Close()
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.URL)
	t.Setenv("OTEL_SERVICE_NAME", "")

	r := runCLI(t, "demo", "--database-url", testkit.DBURL(t), "--merchants", "200", "--transactions", "1000", "--workers", "1")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "tracing: exporting spans over OTLP/HTTP to "+receiver.URL)

	mu.Lock()
	defer mu.Unlock()
	t.Logf("spans received: %v", names)
	require.Equal(t, "sample-settlement", service)
	for _, name := range []string{"stepwise.start", "stepwise.attempt", "stepwise.claim", "stepwise.step", "stepwise.enqueue", "stepwise.send", "river.work/settle_merchants"} {
		require.Positive(t, names[name], "no %s span exported", name)
	}
}

// TestTracingRefusesGRPC: the sample exports over HTTP only; asking for gRPC is a usage error
// that says what to set, not a silent fallback, before the database is touched.
func TestTracingRefusesGRPC(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	r := runCLI(t, "serve", "--database-url", "postgres://127.0.0.1:1/none")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc")
	require.Contains(t, r.stderr, "http/protobuf")
}
