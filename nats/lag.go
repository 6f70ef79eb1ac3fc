package nats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/adapter"
)

// Lag returns a LagReporter of cons (for otelmetrics.ConsumerLag): the
// messages of its stream that match its filter and that it has yet to
// deliver (the consumer info's num_pending), under its durable name. The
// Destination is the stream.
func Lag(cons jetstream.Consumer) (adapter.LagReporter, error) {
	if cons == nil {
		return nil, errors.New("nats: Lag: nil consumer")
	}
	return adapter.LagFunc(func(ctx context.Context) ([]adapter.Lag, error) {
		info, err := cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("nats: lag of consumer: %w", err)
		}
		return []adapter.Lag{{System: "nats", Group: info.Name, Destination: info.Stream, Messages: int64(info.NumPending)}}, nil
	}), nil
}
