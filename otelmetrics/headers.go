package otelmetrics

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts a message's headers to propagation.TextMapCarrier, so
// that an OpenTelemetry propagator can read a trace context from them or
// write one into them. Its type is that of an amqp091 Table, which converts
// to it: otelmetrics.HeaderCarrier(delivery.Headers).
//
// Get returns a value that is a string or a []byte, and "" for any other;
// a name not found exactly is looked up without regard to case. Set stores
// a string, and needs a non-nil map.
type HeaderCarrier map[string]any

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the value of the header named key.
func (c HeaderCarrier) Get(key string) string {
	v, ok := c[key]
	if !ok {
		for k, kv := range c {
			if strings.EqualFold(k, key) {
				v = kv
				break
			}
		}
	}
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set sets the header named key to value.
func (c HeaderCarrier) Set(key, value string) { c[key] = value }

// Keys returns the headers' names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// ContextFromHeaders returns ctx with the trace context (and baggage) that
// the global propagator, otel.GetTextMapPropagator, finds in a message's
// headers, so that the delivery's span continues the producer's trace. An
// amqp091 Table can be passed as it is. Headers without a trace context
// leave ctx as it was.
//
// The global propagator does nothing until the application sets one, for
// example otel.SetTextMapPropagator(propagation.TraceContext{}). For another
// propagator, call its Extract with a HeaderCarrier.
func ContextFromHeaders(ctx context.Context, headers map[string]any) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, HeaderCarrier(headers))
}
