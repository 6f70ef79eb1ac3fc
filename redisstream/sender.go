package redisstream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// A Sender adds outbox calls to Redis streams, for an outbox.Relay
// (register it with outbox.WithSender). Each call becomes one entry
// (XADD with an id Redis assigns) of three fields: DefaultKeyField, the
// row's idempotency key; adapter.EventTimeHeader, its event time; and
// PayloadField, its payload. Redis does not drop a repeated XADD: a relay
// that sends again — its reply was lost, its lease expired mid-call —
// adds a second entry, with a new id. Consumers downstream read the key
// from DefaultKeyField (the Consumer's default key), so the second entry
// is a Duplicate there, applied once.
//
// The event time is the event time of the message whose handler enqueued
// the call (outbox.WithEventTime, Message.EventTime), so that a consumer
// downstream claims the entry under the original event time — the same
// day's partition, the same retention fence — however late or often the
// relay sends it. A call enqueued without one carries its row's
// CreatedAt, when the enqueueing transaction began, which is as stable:
// the same on every send of the row.
//
// A call enqueued with outbox.WithOrder also carries its ordering key and
// sequence in adapter.OrderKeyHeader and adapter.OrderSeqHeader, read by a
// consumer created idempotent.WithOrdering (docs/ordering.md).
type Sender struct {
	rdb    redis.UniversalClient
	stream func(m outbox.Message) string
}

// NewSender returns a Sender that adds each call to the stream stream
// returns for it (for instance a fixed "orders", or one per kind).
func NewSender(client redis.UniversalClient, stream func(m outbox.Message) string) (*Sender, error) {
	if client == nil || stream == nil {
		return nil, errors.New("redisstream: NewSender: nil client or stream function")
	}
	return &Sender{rdb: client, stream: stream}, nil
}

// Send adds m to its stream and waits for Redis's reply. An empty stream
// name is a permanent failure; any other error is retried by the relay.
func (s *Sender) Send(ctx context.Context, m outbox.Message) error {
	stream := s.stream(m)
	if stream == "" {
		return outbox.Permanent(fmt.Errorf("redisstream: no stream for outbox call %d (%s)", m.ID, m.Kind))
	}
	vals := []any{DefaultKeyField, m.IdempotencyKey}
	if at := m.StableEventTime(); !at.IsZero() {
		vals = append(vals, adapter.EventTimeHeader, adapter.FormatEventTime(at))
	}
	for _, k := range slices.Sorted(maps.Keys(m.Trace)) {
		vals = append(vals, k, m.Trace[k])
	}
	if m.OrderKey != "" {
		vals = append(vals, adapter.OrderKeyHeader, m.OrderKey, adapter.OrderSeqHeader, adapter.FormatOrderSeq(m.OrderSeq))
	}
	vals = append(vals, PayloadField, string(m.Payload))
	if err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: vals}).Err(); err != nil {
		return fmt.Errorf("redisstream: add outbox call %d to %q: %w", m.ID, stream, err)
	}
	return nil
}

var _ outbox.Sender = (*Sender)(nil)
