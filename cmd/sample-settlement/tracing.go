package main

import (
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"

	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// setupTracing installs an OTLP trace exporter as otel's global TracerProvider when the
// standard variables ask for one (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; the exporter reads the rest of OTEL_EXPORTER_OTLP_*,
// the SDK OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER). Stepwise's
// components use the global provider, so nothing else changes. Without the variables it
// does nothing: the library never exports by itself. The returned function flushes what is
// buffered; call it on the way out.
//
// With tracing on it also returns River's otelriver middleware for the River client: River's
// insert and work spans then frame Stepwise's (a step's attempt under River's work span).
// otelriver v0.12 is built against River v0.41 and compiles against the v0.51.2 used here;
// its trace propagation is left off, since Stepwise carries its own traceparent in the job.
func setupTracing(ctx context.Context, stderr io.Writer) (shutdown func(), middleware []rivertype.Middleware, err error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return func() {}, nil, nil
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := os.Getenv(v); p != "" && p != "http/protobuf" {
			return nil, nil, cmdline.UsageError("%s=%s: this sample exports OTLP over HTTP only; set it to http/protobuf (or unset it) and point the endpoint at the collector's HTTP port (4318)", v, p)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: creating the OTLP exporter from OTEL_EXPORTER_OTLP_*: %w", err)
	}
	// The SDK's default resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; a
	// service not named there is "sample-settlement" rather than "unknown_service".
	res := resource.Default()
	if os.Getenv("OTEL_SERVICE_NAME") == "" && !strings.Contains(os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), "service.name=") {
		if res, err = resource.Merge(res, resource.NewSchemaless(attribute.String("service.name", "sample-settlement"))); err != nil {
			return nil, nil, fmt.Errorf("tracing: resource: %w", err)
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	fmt.Fprintf(stderr, "tracing: exporting spans over OTLP/HTTP to %s\n", endpointShown())
	middleware = []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{EnableWorkSpanJobKindSuffix: true})}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			fmt.Fprintf(stderr, "tracing: flushing spans: %v\n", err)
		}
	}, middleware, nil
}

// endpointShown is the endpoint the exporter uses, without any credentials in it.
func endpointShown() string {
	e := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if e == "" {
		e = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	return cmdline.RedactURL(e)
}
