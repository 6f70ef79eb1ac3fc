package tests

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/otelmetrics"
	"github.com/txclaim/idempotent/rabbitmq"
)

// The OpenTelemetry observer's spans for real deliveries: applied, duplicate,
// retried after a real 40001, failed by the handler and failed by exhausted
// retries; and a span that continues a producer's trace carried through
// RabbitMQ in the message's headers.

// tracing returns an Observer recording spans into an in-memory exporter,
// and a tracer of the same provider for the test's own spans.
func tracing(t *testing.T) (*otelmetrics.Observer, *tracetest.InMemoryExporter, trace.Tracer) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := otelmetrics.New(metric.NewMeterProvider(), otelmetrics.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	return obs, exp, tp.Tracer("test")
}

// spanAttrs returns a span's or an event's attributes by key.
func spanAttrs(kvs []attribute.KeyValue) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

// deliverySpans returns the spans of consumer's deliveries by key, failing
// the test if a key has more than one.
func deliverySpans(t *testing.T, exp *tracetest.InMemoryExporter, consumer string) map[string]tracetest.SpanStub {
	t.Helper()
	out := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.Name != consumer+" process" {
			continue
		}
		k := spanAttrs(s.Attributes)["idempotent.key"]
		if _, dup := out[k]; dup {
			t.Fatalf("two spans for key %q", k)
		}
		out[k] = s
	}
	return out
}

func TestOTelSpansOfRealDeliveries(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	obs, exp, tracer := tracing(t)
	l := newLoyalty(t, db, idempotent.WithObserver(obs), idempotent.WithRetry(fastRetry(3)))
	ctx, root := tracer.Start(context.Background(), "test")

	// applied, with the handler's own span under the delivery's
	a := orderCompleted{OrderID: 1, CustomerID: 1, TotalCents: 1000}
	credit := func(ctx context.Context, tx *sql.Tx) error {
		ctx, span := tracer.Start(ctx, "credit")
		defer span.End()
		return l.credit(ctx, tx, a)
	}
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: a.key()}, credit); got != idempotent.Applied || err != nil {
		t.Fatalf("first delivery: (%v, %v)", got, err)
	}
	// duplicate
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: a.key()}, credit); got != idempotent.Duplicate || err != nil {
		t.Fatalf("redelivery: (%v, %v)", got, err)
	}
	// a serialization failure raised by the server, retried once
	b := orderCompleted{OrderID: 2, CustomerID: 2, TotalCents: 2000}
	attempt := 0
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: b.key()}, func(ctx context.Context, tx *sql.Tx) error {
		if attempt++; attempt == 1 {
			return raise(ctx, tx, "40001")
		}
		return l.credit(ctx, tx, b)
	}); got != idempotent.Applied || err != nil {
		t.Fatalf("retried delivery: (%v, %v)", got, err)
	}
	// the handler's error
	c := orderCompleted{OrderID: 3, CustomerID: 3, TotalCents: 3000}
	herr := &handlerError{order: 3}
	if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: c.key()}, func(context.Context, *sql.Tx) error { return herr }); !errors.Is(err, herr) {
		t.Fatalf("failing delivery: %v", err)
	}
	// 40001 on every attempt
	d := orderCompleted{OrderID: 4, CustomerID: 4, TotalCents: 4000}
	if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: d.key()}, func(ctx context.Context, tx *sql.Tx) error { return raise(ctx, tx, "40001") }); !errors.Is(err, idempotent.ErrRetriesExhausted) {
		t.Fatalf("exhausted delivery: %v", err)
	}
	root.End()

	// The exporter has the spans in the order they ended.
	var spans []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "loyalty process" {
			spans = append(spans, s)
		}
	}
	if len(spans) != 5 {
		t.Fatalf("%d delivery spans, want 5: %v", len(spans), spans)
	}
	type want struct {
		key, outcome, attempts, etype string
		status                        codes.Code
		retries                       int
	}
	for i, w := range []want{
		{a.key(), "applied", "1", "", codes.Unset, 0},
		{a.key(), "duplicate", "1", "", codes.Unset, 0},
		{b.key(), "applied", "2", "", codes.Unset, 1},
		{c.key(), "error", "1", "*tests.handlerError", codes.Error, 0},
		{d.key(), "error", "3", "retries_exhausted", codes.Error, 2},
	} {
		s, name := spans[i], w.key+" "+w.outcome
		m := spanAttrs(s.Attributes)
		if m["idempotent.key"] != w.key || m["idempotent.outcome"] != w.outcome || m["idempotent.attempts"] != w.attempts || m["error.type"] != w.etype || s.Status.Code != w.status {
			t.Errorf("%s: outcome %q, attempts %s, error.type %q, status %v; want %q, %s, %q, %v",
				name, m["idempotent.outcome"], m["idempotent.attempts"], m["error.type"], s.Status.Code, w.outcome, w.attempts, w.etype, w.status)
		}
		if m["idempotent.consumer"] != "loyalty" || m["messaging.operation.type"] != "process" || s.SpanKind != trace.SpanKindConsumer {
			t.Errorf("%s: attributes %v, kind %v", name, m, s.SpanKind)
		}
		if s.Parent.SpanID() != root.SpanContext().SpanID() || s.SpanContext.TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s: parent %v, want the caller's span", name, s.Parent.SpanID())
		}
		retries := 0
		for _, e := range s.Events {
			if e.Name != "retry" {
				continue
			}
			retries++
			em := spanAttrs(e.Attributes)
			if em["db.response.status_code"] != "40001" || em["idempotent.retry.reason"] != "serialization" || e.Time.Before(s.StartTime) || e.Time.After(s.EndTime) {
				t.Errorf("%s: retry event %v at %v, want a serialization failure 40001 within the span", name, em, e.Time)
			}
		}
		if retries != w.retries {
			t.Errorf("%s: %d retry events, want %d", name, retries, w.retries)
		}
	}
	var parents []trace.SpanID
	for _, s := range exp.GetSpans() {
		if s.Name == "credit" {
			parents = append(parents, s.Parent.SpanID())
		}
	}
	if len(parents) != 1 || parents[0] != spans[0].SpanContext.SpanID() {
		t.Errorf("the handler's spans have parents %v, want one under the applied delivery's span %v", parents, spans[0].SpanContext.SpanID())
	}
	if p := l.balance(t, 1) + l.balance(t, 2); p != pointsFor(a)+pointsFor(b) {
		t.Errorf("balances sum to %d, want %d", p, pointsFor(a)+pointsFor(b))
	}
}

// A producer's trace context travels in the AMQP headers; the adapter's
// delivery context extracts it, and the delivery's span continues the
// producer's trace. A delivery without one starts a trace of its own.
func TestOTelRabbitMQContinuesTheProducersTrace(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	db := openDB(t)
	db.SetMaxOpenConns(2)
	// The application's start-up choice; no other test reads the global.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	obs, exp, tracer := tracing(t)
	l := newLoyalty(t, db, idempotent.WithObserver(obs))
	top := declareTopology(t, url)
	admin := dialTest(t, url)

	traced := orderCompleted{OrderID: 11, CustomerID: 11, TotalCents: 1100}
	untraced := orderCompleted{OrderID: 12, CustomerID: 12, TotalCents: 1200}
	pctx, publish := tracer.Start(context.Background(), "orders publish", trace.WithSpanKind(trace.SpanKindProducer))
	m := orderMessage(t, traced)
	m.Headers = amqp.Table{}
	otel.GetTextMapPropagator().Inject(pctx, otelmetrics.HeaderCarrier(m.Headers))
	publish.End()
	if _, ok := m.Headers["traceparent"]; !ok {
		t.Fatalf("no traceparent injected: %v", m.Headers)
	}
	newPublisher(t, admin, top.queue).publish(t, m, orderMessage(t, untraced))

	c := l.orderConsumer(t, rabbitmq.WithDeliveryContext(func(ctx context.Context, d *amqp.Delivery) context.Context {
		return otelmetrics.ContextFromHeaders(ctx, d.Headers)
	}))
	if err := runUntil(t, c, dialTest(t, url), top.queue, "two acks", func() bool { return c.Stats().Applied == 2 }); err != nil {
		t.Fatal(err)
	}

	spans := deliverySpans(t, exp, "loyalty")
	s, ok := spans[traced.key()]
	if !ok {
		t.Fatalf("no span for %s: %v", traced.key(), exp.GetSpans())
	}
	if s.SpanContext.TraceID() != publish.SpanContext().TraceID() || s.Parent.SpanID() != publish.SpanContext().SpanID() || !s.Parent.IsRemote() {
		t.Errorf("the delivery's span is in trace %v under %v, want the producer's trace %v under its span %v",
			s.SpanContext.TraceID(), s.Parent.SpanID(), publish.SpanContext().TraceID(), publish.SpanContext().SpanID())
	}
	if got := spanAttrs(s.Attributes)["idempotent.outcome"]; got != "applied" {
		t.Errorf("outcome %q, want applied", got)
	}
	u, ok := spans[untraced.key()]
	if !ok {
		t.Fatalf("no span for %s", untraced.key())
	}
	if u.Parent.IsValid() || u.SpanContext.TraceID() == s.SpanContext.TraceID() {
		t.Errorf("the untraced delivery's span has parent %v in trace %v, want a trace of its own", u.Parent, u.SpanContext.TraceID())
	}
}
