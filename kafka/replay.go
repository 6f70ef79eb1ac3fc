package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// ReplayKind is the outbox kind of the replays of dead letters
// (deadletter.ReplayKind(DeadLetterKind)); register ReplaySender for it on
// the Relay.
const ReplayKind = DeadLetterKind + "-replay"

// ReplayIDHeader carries a replay's outbox idempotency key, the same on
// every copy a relay produces of one replay.
const ReplayIDHeader = "dead-letter-replay-id"

// ReplaySender returns the outbox Sender that produces the replays
// deadletter.Store.Replay writes (a DeadLetter as payload) back to their
// source topic with cl, synchronously: the original record's key, value
// and headers, with the event time the consumer read in the
// adapter.EventTimeHeader header in place of the original's (as
// DeadLetterSender does), plus ReplayIDHeader. The consumer reads its
// message key from the same headers as before, so a replay of a record
// applied since is a Duplicate. A payload that is not a DeadLetter fails
// permanently.
func ReplaySender(cl *kgo.Client) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		var d DeadLetter
		if err := json.Unmarshal(m.Payload, &d); err != nil || d.SourceTopic == "" {
			return outbox.Permanent(fmt.Errorf("kafka: outbox row %d is not a dead letter to replay: %v", m.ID, err))
		}
		rec := &kgo.Record{Topic: d.SourceTopic, Key: d.Key, Value: d.Value, Headers: withEventTime(d.Headers, m)}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ReplayIDHeader, Value: []byte(m.IdempotencyKey)})
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return fmt.Errorf("kafka: produce replay of %s: %w", partitionSource(d.SourceTopic, d.Partition, d.Offset), err)
		}
		return nil
	})
}

// withEventTime returns a copy of headers with m's event time, when it has
// one, in the adapter.EventTimeHeader header in place of any there.
func withEventTime(headers []kgo.RecordHeader, m outbox.Message) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, len(headers)+4)
	for _, h := range headers {
		if !m.EventTime.IsZero() && h.Key == adapter.EventTimeHeader {
			continue
		}
		if _, ok := m.Trace[h.Key]; ok {
			continue // the relay's send span, in place of the original's
		}
		out = append(out, h)
	}
	for _, k := range slices.Sorted(maps.Keys(m.Trace)) {
		out = append(out, kgo.RecordHeader{Key: k, Value: []byte(m.Trace[k])})
	}
	if !m.EventTime.IsZero() {
		out = append(out, kgo.RecordHeader{Key: adapter.EventTimeHeader, Value: []byte(adapter.FormatEventTime(m.EventTime))})
	}
	return out
}
