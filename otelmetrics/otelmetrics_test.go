package otelmetrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/otelmetrics"
)

// collect returns the named metric from reader.
func collect(t *testing.T, reader *sdkmetric.ManualReader, name string) metricdata.Aggregation {
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
			if m.Name == name {
				return m.Data
			}
		}
	}
	t.Fatalf("metric %s not recorded", name)
	return nil
}

func sumBy(t *testing.T, data metricdata.Aggregation, key string) map[string]int64 {
	t.Helper()
	sum, ok := data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("got %T, want an int64 sum", data)
	}
	out := map[string]int64{}
	for _, dp := range sum.DataPoints {
		v, _ := dp.Attributes.Value(attribute.Key(key))
		out[v.AsString()] += dp.Value
	}
	return out
}

func TestObserverRecordsOutcomesRetriesAndDurations(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := otelmetrics.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Outcome: idempotent.Applied, Attempts: 1, Duration: 3 * time.Millisecond})
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Outcome: idempotent.Duplicate, Attempts: 1, Duration: time.Millisecond})
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Outcome: idempotent.Duplicate, Attempts: 2, Duration: time.Millisecond})
	obs.Outcome(ctx, idempotent.Event{Consumer: "loyalty", Err: errors.New("boom")})
	obs.Retry(ctx, idempotent.RetryEvent{Consumer: "loyalty", Reason: "serialization", Code: "40001"})
	obs.Retry(ctx, idempotent.RetryEvent{Consumer: "loyalty", Reason: "serialization", Code: "40P01"})
	obs.Retry(ctx, idempotent.RetryEvent{Consumer: "loyalty", Reason: "serialization", Code: "40001"})

	got := sumBy(t, collect(t, reader, "idempotent.outcomes"), "outcome")
	if want := map[string]int64{"applied": 1, "duplicate": 2, "error": 1}; !equal(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	got = sumBy(t, collect(t, reader, "idempotent.retries"), "sqlstate")
	if want := map[string]int64{"40001": 2, "40P01": 1}; !equal(got, want) {
		t.Errorf("retries %v, want %v", got, want)
	}
	h, ok := collect(t, reader, "idempotent.duration").(metricdata.Histogram[float64])
	if !ok {
		t.Fatal("duration is not a float64 histogram")
	}
	var n uint64
	var total float64
	for _, dp := range h.DataPoints {
		n += dp.Count
		total += dp.Sum
	}
	if n != 4 || total < 0.0049 || total > 0.0051 {
		t.Errorf("duration: %d records summing to %gs, want 4 summing to 0.005s", n, total)
	}
}

func TestNewRejectsNilProvider(t *testing.T) {
	if _, err := otelmetrics.New(nil); err == nil {
		t.Fatal("New(nil) returned no error")
	}
}

func equal(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
