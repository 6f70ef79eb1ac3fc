package adapter

import "context"

// Lag is how far a consumer is behind on one partition of what it
// consumes, as its transport counts it.
type Lag struct {
	// System is the messaging system, as OpenTelemetry's messaging.system
	// names it: "kafka", "redis", "nats"…
	System string
	// Group is the consumer group (a Kafka group, a Redis Streams group,
	// a JetStream durable consumer).
	Group string
	// Destination is the topic, stream or subject.
	Destination string
	// Partition is the partition ("" when the transport has none).
	Partition string
	// Messages is how many messages the group has yet to receive there.
	Messages int64
}

// A LagReporter reads a consumer's lag from its transport (package
// otelmetrics reports it as a gauge). The adapters whose transport knows
// it provide one; it needs the broker's client, so it lives in the
// adapter's module.
type LagReporter interface {
	Lag(ctx context.Context) ([]Lag, error)
}

// LagFunc is a LagReporter of a function.
type LagFunc func(ctx context.Context) ([]Lag, error)

// Lag calls f.
func (f LagFunc) Lag(ctx context.Context) ([]Lag, error) { return f(ctx) }
