package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/otelmetrics"
	"github.com/txclaim/idempotent/postgres"
)

// gaugePoints collects reader and returns the data points of the named
// gauge, by the value of attribute key.
func gaugePoints[N int64 | float64](t *testing.T, reader *sdkmetric.ManualReader, name string, key attribute.Key) map[string]N {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelmetrics.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			g, ok := m.Data.(metricdata.Gauge[N])
			if !ok {
				t.Fatalf("%s is a %T", name, m.Data)
			}
			out := map[string]N{}
			for _, dp := range g.DataPoints {
				v, _ := dp.Attributes.Value(key)
				out[v.Emit()] = dp.Value
			}
			return out
		}
	}
	t.Fatalf("gauge %s not reported", name)
	return nil
}

// TestGaugesReportTheTables reads every gauge of otelmetrics.Gauges through
// the SDK's manual reader after putting known figures in the tables: rows
// waiting in an outbox, dead letters in it, a parked message, a retention
// horizon, and a lag from a LagReporter.
func TestGaugesReportTheTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t)
	ob, schema := newOutbox(t, db, "orders")
	mw, err := idempotent.New(db, postgres.New(), "shipping", idempotent.WithTable(schema+".processed_messages"),
		idempotent.WithRetention(7*24*time.Hour),
		idempotent.WithOrdering(idempotent.Ordering{Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return nil }}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	store, err := deadletter.New(db, deadletter.WithTable(schema+".outbox"), deadletter.WithAuditTable(schema+".dead_letter_audit"))
	if err != nil {
		t.Fatal(err)
	}

	// 3 rows to send, 2 dead letters of topic payments: 5 pending rows.
	for i := range 3 {
		enqueue(t, db, ob, fmt.Sprintf("order-%d", i), "order-placed", `{}`)
	}
	for i := range 2 {
		enqueue(t, db, ob, fmt.Sprintf("payments/0/%d", i), deadletter.KafkaKind, `{"source_topic":"payments","error":"ledger refused"}`)
	}
	// Sequence 2 of account a comes before 1: parked.
	late := idempotent.Message{Key: "a-2", OrderKey: "a", OrderSeq: 2, Payload: []byte("{}")}
	if out, err := mw.ProcessMessage(ctx, late, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Parked {
		t.Fatalf("late message: %v, %v; want Parked", out, err)
	}
	if _, err := mw.ClaimTable().Cleanup(ctx, idempotent.DefaultCleanupOptions()); err != nil {
		t.Fatal(err)
	}
	lag := adapter.LagFunc(func(context.Context) ([]adapter.Lag, error) {
		return []adapter.Lag{{System: "kafka", Group: "shipping", Destination: "orders", Partition: "3", Messages: 42}}, nil
	})

	reader := sdkmetric.NewManualReader()
	g, err := otelmetrics.NewGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		otelmetrics.Outbox(ob), otelmetrics.DeadLetters(store), otelmetrics.Parking(mw), otelmetrics.Horizon(mw.ClaimTable()),
		otelmetrics.ConsumerLag(lag))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })

	consumer := attribute.Key("idempotent.consumer")
	if got := gaugePoints[int64](t, reader, "idempotent.outbox.backlog", consumer); got["orders"] != 5 || len(got) != 1 {
		t.Errorf("outbox backlog %v, want orders: 5", got)
	}
	if got := gaugePoints[float64](t, reader, "idempotent.outbox.oldest_pending.age", consumer); got["orders"] <= 0 {
		t.Errorf("oldest pending age %v, want above 0", got)
	}
	if got := gaugePoints[int64](t, reader, "idempotent.dead_letters", "messaging.destination.name"); got["payments"] != 2 || len(got) != 1 {
		t.Errorf("dead letters %v, want payments: 2", got)
	}
	if got := gaugePoints[int64](t, reader, "idempotent.parked", consumer); got["shipping"] != 1 || len(got) != 1 {
		t.Errorf("parked %v, want shipping: 1", got)
	}
	if got := gaugePoints[float64](t, reader, "idempotent.parked.oldest.age", consumer); got["shipping"] < 0 {
		t.Errorf("oldest park age %v, want shipping: 0 or more", got)
	}
	week := (7 * 24 * time.Hour).Seconds()
	hz := gaugePoints[float64](t, reader, "idempotent.retention.horizon.age", "idempotent.claim_table")
	if age, ok := hz[schema+".processed_messages"]; !ok || age < week-3600 || age > week+3600 {
		t.Errorf("horizon age %v, want about a week (%v s) for %s.processed_messages", hz, week, schema)
	}
	if got := gaugePoints[int64](t, reader, "messaging.consumer.lag", "messaging.destination.partition.id"); got["3"] != 42 || len(got) != 1 {
		t.Errorf("lag %v, want partition 3: 42", got)
	}

	// The parked message released: the gauge follows.
	first := idempotent.Message{Key: "a-1", OrderKey: "a", OrderSeq: 1}
	if out, err := mw.ProcessMessage(ctx, first, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Applied {
		t.Fatalf("first message: %v, %v; want Applied", out, err)
	}
	if got := gaugePoints[int64](t, reader, "idempotent.parked", consumer); got["shipping"] != 0 {
		t.Errorf("parked after release %v, want shipping: 0", got)
	}
}

// TestGaugesRefuseBadSources: nil sources, a Middleware that parks
// nothing, and no source at all are errors of NewGauges.
func TestGaugesRefuseBadSources(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	plain, err := idempotent.New(db, postgres.New(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider()
	for name, srcs := range map[string][]otelmetrics.Source{
		"none":        nil,
		"zero":        {{}},
		"nil outbox":  {otelmetrics.Outbox(nil)},
		"nil store":   {otelmetrics.DeadLetters(nil)},
		"nil lag":     {otelmetrics.ConsumerLag(nil)},
		"not ordered": {otelmetrics.Parking(plain)},
	} {
		if _, err := otelmetrics.NewGauges(mp, srcs...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// A failing source is the reader's error; the others are reported.
	reader := sdkmetric.NewManualReader()
	boom := errors.New("broker unreachable")
	if _, err := otelmetrics.NewGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		otelmetrics.ConsumerLag(adapter.LagFunc(func(context.Context) ([]adapter.Lag, error) { return nil, boom })),
		otelmetrics.ConsumerLag(adapter.LagFunc(func(context.Context) ([]adapter.Lag, error) {
			return []adapter.Lag{{System: "nats", Group: "g", Destination: "orders", Messages: 7}}, nil
		}))); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); !errors.Is(err, boom) {
		t.Errorf("Collect: %v, want %v", err, boom)
	}
	var seven bool
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "messaging.consumer.lag" {
				seven = len(g.DataPoints) == 1 && g.DataPoints[0].Value == 7
			}
		}
	}
	if !seven {
		t.Errorf("the answering source's lag is not reported beside the failing one's error: %+v", rm.ScopeMetrics)
	}
}
