package outbox

import (
	"context"
	"errors"
	"strings"
)

// The names under which a trace context travels, in a Message's Trace and
// in a transport's headers: W3C Trace Context and W3C Baggage.
const (
	TraceParentHeader = "traceparent"
	TraceStateHeader  = "tracestate"
	BaggageHeader     = "baggage"
)

// Bounds of the trace context Enqueue stores with a row. A value past its
// bound is not stored (baggage keeps its first members that fit): a trace
// context never makes Enqueue fail.
const (
	// MaxTraceParentBytes bounds traceparent: a version-00 value has 55
	// bytes; later versions may append fields.
	MaxTraceParentBytes = 256
	// MaxTraceStateBytes bounds tracestate: the W3C recommends that vendors
	// propagate at least 512 bytes of it.
	MaxTraceStateBytes = 512
	// MaxBaggageBytes bounds baggage, which an application may fill with
	// anything: members past it are dropped, whole.
	MaxBaggageBytes = 1024
)

// A Tracer connects an outbox to a tracing library (package oteltrace
// implements one for OpenTelemetry), so that one trace runs from the
// transaction that enqueued a call to the consumer of the message a Sender
// publishes: Enqueue stores the caller's trace context with the row, and
// each attempt of a relay runs in a span whose parent is that context. Give
// one to New with WithTracer.
type Tracer interface {
	// Inject returns the trace context of ctx to store with a row, by the
	// names TraceParentHeader, TraceStateHeader and BaggageHeader; nil or
	// an empty map for none. Values past their bound (MaxTraceParentBytes,
	// …) or that are not printable ASCII are not stored.
	Inject(ctx context.Context) map[string]string
	// StartSend starts the span of one attempt to send m, whose Trace is the
	// trace context stored with its row (nil when none). It returns the
	// context the Sender runs with, the trace context the Sender puts in
	// the transport's headers (the send span's, becoming Message.Trace), and
	// a function the relay calls with the attempt's error once the Sender
	// returned.
	StartSend(ctx context.Context, m Message) (sctx context.Context, trace map[string]string, end func(error))
}

// WithTracer sets the Tracer that records the trace context of every
// Enqueue and traces every attempt of the relays built on this Outbox.
// Default is none: rows carry no trace context, and Message.Trace is nil.
func WithTracer(t Tracer) Option {
	return optionFunc(func(c *config) error {
		if t == nil {
			return errors.New("outbox: WithTracer: nil Tracer")
		}
		c.tracer = t
		return nil
	})
}

// traceColumns returns the trace_parent, trace_state and baggage parameters
// of a row from the Tracer's trace context: NULL for a missing, oversized or
// unprintable value; baggage cut after its last member that fits.
func traceColumns(tc map[string]string) (parent, state, baggage any) {
	keep := func(name string, limit int) any {
		v := strings.TrimSpace(tc[name])
		if v == "" || len(v) > limit || !printable(v) {
			return nil
		}
		return v
	}
	parent, state = keep(TraceParentHeader, MaxTraceParentBytes), keep(TraceStateHeader, MaxTraceStateBytes)
	b := strings.TrimSpace(tc[BaggageHeader])
	for len(b) > MaxBaggageBytes {
		i := strings.LastIndexByte(b, ',')
		if i < 0 {
			b = ""
			break
		}
		b = strings.TrimSpace(b[:i])
	}
	if b != "" && printable(b) {
		baggage = b
	}
	return parent, state, baggage
}

// printable reports whether s is printable ASCII (space included), as
// header values of every transport allow.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// traceOf is the Message.Trace of a row whose trace columns are given:
// nil when it has none.
func traceOf(parent, state, baggage *string) map[string]string {
	var tc map[string]string
	for _, f := range []struct {
		name string
		v    *string
	}{{TraceParentHeader, parent}, {TraceStateHeader, state}, {BaggageHeader, baggage}} {
		if f.v == nil || *f.v == "" {
			continue
		}
		if tc == nil {
			tc = make(map[string]string, 3)
		}
		tc[f.name] = *f.v
	}
	return tc
}
