package kafka

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// DeadLetterKind is the outbox kind of dead-lettered records; register
// DeadLetterSender for it on the Relay.
const DeadLetterKind = "kafka-dead-letter"

// Headers DeadLetterSender adds to a dead-lettered record, beside the
// original record's own headers.
const (
	// DeadLetterIDHeader carries the outbox row's idempotency key, the same
	// on every copy a relay produces of one dead letter: the dead-letter
	// topic's readers drop repeats by it.
	DeadLetterIDHeader = "dead-letter-id"
	// DeadLetterSourceHeader carries "topic/partition/offset" of the
	// original record.
	DeadLetterSourceHeader = "dead-letter-source"
	// DeadLetterErrorHeader carries the error that made the record poison.
	DeadLetterErrorHeader = "dead-letter-error"
)

// DeadLetter is the payload of a dead-letter outbox row: a poison record,
// byte for byte, and why it was poison.
type DeadLetter struct {
	// Topic is the dead-letter topic to produce to.
	Topic string `json:"topic"`
	// SourceTopic, Partition and Offset locate the original record.
	SourceTopic string `json:"source_topic"`
	Partition   int32  `json:"partition"`
	Offset      int64  `json:"offset"`
	// Key and Value are the record's, Headers its headers in order.
	Key     []byte             `json:"key,omitempty"`
	Value   []byte             `json:"value,omitempty"`
	Headers []kgo.RecordHeader `json:"headers,omitempty"`
	// Timestamp is the record's timestamp.
	Timestamp time.Time `json:"timestamp"`
	// Error is the error that made the record poison.
	Error string `json:"error"`
}

// deadLetter writes the poison record r, whose event time was read as at
// (zero if none), into the dead-letter outbox in tx, under the record's
// position (the one identity every record has: a poison record may have no
// key), with the event time.
func (c *Consumer) deadLetter(ctx context.Context, tx *sql.Tx, r *kgo.Record, cause error, at time.Time) error {
	dl := DeadLetter{
		Topic: c.cfg.deadTopic, SourceTopic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp, Error: cause.Error(),
	}
	if err := adapter.WriteDeadLetter(ctx, tx, c.cfg.deadLetter, position(r), DeadLetterKind, dl, at); err != nil {
		return fmt.Errorf("kafka: dead letter %s: %w", position(r), err)
	}
	return nil
}

// DeadLetterSender returns the outbox Sender that produces dead letters to
// their dead-letter topic with cl, synchronously: the original record's
// key, value and headers, plus DeadLetterIDHeader, DeadLetterSourceHeader
// and DeadLetterErrorHeader. The event time travels with it: the outbox row
// holds the record's event time as the Consumer read it (its
// adapter.EventTimeHeader, WithEventTime's function, or its timestamp with
// WithTransportEventTime), and the dead letter carries it in the
// adapter.EventTimeHeader header, in place of the original's, so that a
// replay from the dead-letter topic is claimed under the original event
// time — the same day's partition, the same retention fence. A record that
// had none keeps its headers as they were (a malformed event-time header
// among them). The record timestamp is not copied: the dead-letter topic's
// time-based retention would count from it. A relay may produce a dead
// letter more than once (after a lost acknowledgement); each copy carries
// the same DeadLetterIDHeader. A payload that is not a DeadLetter fails
// permanently.
func DeadLetterSender(cl *kgo.Client) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		var d DeadLetter
		if err := json.Unmarshal(m.Payload, &d); err != nil || d.Topic == "" {
			return outbox.Permanent(fmt.Errorf("kafka: outbox row %d is not a dead letter: %v", m.ID, err))
		}
		rec := &kgo.Record{Topic: d.Topic, Key: d.Key, Value: d.Value, Headers: withEventTime(d.Headers, m)}
		rec.Headers = append(rec.Headers,
			kgo.RecordHeader{Key: DeadLetterIDHeader, Value: []byte(m.IdempotencyKey)},
			kgo.RecordHeader{Key: DeadLetterSourceHeader, Value: []byte(partitionSource(d.SourceTopic, d.Partition, d.Offset))},
			kgo.RecordHeader{Key: DeadLetterErrorHeader, Value: []byte(d.Error)},
		)
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return fmt.Errorf("kafka: produce dead letter to %s: %w", d.Topic, err)
		}
		return nil
	})
}
