package otelmetrics_test

import (
	"context"
	"database/sql"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/otelmetrics"
	"github.com/txclaim/idempotent/postgres"
)

// Record a span per delivery beside the metrics. In a service, pass the
// application's providers (or otel.GetTracerProvider()); here an in-memory
// exporter shows the span. The empty key is refused before any transaction
// opens, so the example runs without a database, and its span says why.
func ExampleWithTracerProvider() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	obs, err := otelmetrics.New(sdkmetric.NewMeterProvider(), otelmetrics.WithTracerProvider(tp))
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithObserver(obs))
	if err != nil {
		panic(err)
	}

	_, err = mw.ProcessMessage(context.Background(), idempotent.Message{Key: ""}, func(ctx context.Context, tx *sql.Tx) error {
		// ctx carries the delivery's span: spans of an instrumented
		// driver used through tx are its children.
		return nil
	})
	fmt.Println(err != nil)
	for _, s := range spans.GetSpans() {
		fmt.Println(s.Name, s.SpanKind, s.Status.Code)
		for _, a := range s.Attributes {
			if a.Key == "idempotent.outcome" || a.Key == "error.type" {
				fmt.Println(" ", a.Key, a.Value.Emit())
			}
		}
	}
	// Output:
	// true
	// loyalty process consumer Error
	//   idempotent.outcome error
	//   error.type invalid_key
}

// Continue the producer's trace: the producer injects its trace context
// into the message's headers (an amqp091 Table is such a map), and the
// consumer extracts it before the middleware starts the delivery's span.
func ExampleContextFromHeaders() {
	otel.SetTextMapPropagator(propagation.TraceContext{}) // once, at start-up
	tp := sdktrace.NewTracerProvider()
	obs, err := otelmetrics.New(sdkmetric.NewMeterProvider(), otelmetrics.WithTracerProvider(tp))
	if err != nil {
		panic(err)
	}

	// The producer.
	pctx, publish := tp.Tracer("producer").Start(context.Background(), "orders publish")
	headers := map[string]any{}
	otel.GetTextMapPropagator().Inject(pctx, otelmetrics.HeaderCarrier(headers))
	publish.End()

	// The consumer: the middleware calls Start with the context the
	// adapter derived from the delivery (see rabbitmq.WithDeliveryContext).
	ctx := otelmetrics.ContextFromHeaders(context.Background(), headers)
	ctx = obs.Start(ctx, "loyalty", "order-completed:9912")
	fmt.Println("same trace:", publish.SpanContext().TraceID() == trace.SpanContextFromContext(ctx).TraceID())
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Key: "order-completed:9912", Outcome: idempotent.Applied, Attempts: 1})
	// Output: same trace: true
}
