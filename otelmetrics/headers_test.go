package otelmetrics_test

import (
	"context"
	"slices"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent/otelmetrics"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestHeaderCarrier(t *testing.T) {
	c := otelmetrics.HeaderCarrier{
		"traceparent": traceparent,
		"tracestate":  []byte("vendor=1"),
		"Baggage":     "user=7",
		"x-count":     int32(3),
	}
	for _, tc := range []struct{ key, want string }{
		{"traceparent", traceparent},
		{"tracestate", "vendor=1"}, // a byte array, as some AMQP clients send strings
		{"baggage", "user=7"},      // found regardless of case
		{"x-count", ""},            // not text
		{"missing", ""},
	} {
		if got := c.Get(tc.key); got != tc.want {
			t.Errorf("Get(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
	c.Set("x-new", "v")
	if c["x-new"] != "v" {
		t.Errorf("Set stored %v", c["x-new"])
	}
	keys := c.Keys()
	slices.Sort(keys)
	if want := []string{"Baggage", "traceparent", "tracestate", "x-count", "x-new"}; !slices.Equal(keys, want) {
		t.Errorf("Keys() = %v, want %v", keys, want)
	}
}

// A trace context injected into a map of headers by a producer is found in
// it by the consumer.
func TestHeaderCarrierRoundTrip(t *testing.T) {
	prop := propagation.TraceContext{}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	headers := map[string]any{}
	prop.Inject(trace.ContextWithSpanContext(context.Background(), sc), otelmetrics.HeaderCarrier(headers))
	got := trace.SpanContextFromContext(prop.Extract(context.Background(), otelmetrics.HeaderCarrier(headers)))
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsRemote() {
		t.Errorf("extracted %v, want remote %v", got, sc)
	}
}

// ContextFromHeaders uses the global propagator (so the test does not run
// in parallel).
func TestContextFromHeaders(t *testing.T) {
	saved := otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTextMapPropagator(saved) })
	otel.SetTextMapPropagator(propagation.TraceContext{})

	ctx := otelmetrics.ContextFromHeaders(context.Background(), map[string]any{"traceparent": traceparent})
	sc := trace.SpanContextFromContext(ctx)
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsRemote() {
		t.Errorf("extracted %v from the traceparent header", sc)
	}
	if sc := trace.SpanContextFromContext(otelmetrics.ContextFromHeaders(context.Background(), nil)); sc.IsValid() {
		t.Errorf("no headers gave span context %v", sc)
	}
}
