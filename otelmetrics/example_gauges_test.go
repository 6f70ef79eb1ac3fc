package otelmetrics_test

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/otelmetrics"
)

// Report a consumer's lag, read at each collection. In a service the
// source is the adapter's (kafka.Consumer.Lag, redisstream.Lag, nats.Lag),
// beside otelmetrics.Outbox, Parking, DeadLetters and Horizon, and the
// MeterProvider the application's.
func ExampleNewGauges() {
	reader := sdkmetric.NewManualReader()
	lag := adapter.LagFunc(func(context.Context) ([]adapter.Lag, error) {
		return []adapter.Lag{{System: "kafka", Group: "shipping", Destination: "orders", Partition: "0", Messages: 12}}, nil
	})
	g, err := otelmetrics.NewGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), otelmetrics.ConsumerLag(lag))
	if err != nil {
		panic(err)
	}
	defer g.Close()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if gauge, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "messaging.consumer.lag" {
			fmt.Println(m.Name, gauge.DataPoints[0].Value)
		}
	}
	// Output: messaging.consumer.lag 12
}
