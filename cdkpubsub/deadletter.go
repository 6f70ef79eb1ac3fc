package cdkpubsub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// Metadata keys DeadLetterSender adds to a dead letter, beside the poison
// message's own metadata.
const (
	// DeadLetterIDMetadata carries the outbox row's idempotency key, the
	// same on every copy a relay publishes of one dead letter: the
	// dead-letter topic's readers drop repeats by it.
	DeadLetterIDMetadata = "dead-letter-id"
	// DeadLetterErrorMetadata carries the error that made the message
	// poison.
	DeadLetterErrorMetadata = "dead-letter-error"
	// DeadLetterSourceMetadata carries the poison delivery's LoggableID,
	// for logs only.
	DeadLetterSourceMetadata = "dead-letter-source"
)

// DeadLetter is the payload of a dead-letter outbox row (WithDeadLetter): a
// poison message, byte for byte, and why it was poison.
type DeadLetter struct {
	// Body and Metadata are the message's.
	Body     []byte            `json:"body"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// LoggableID is the delivery's LoggableID, for logs.
	LoggableID string `json:"loggable_id,omitempty"`
	// Error is the error that made the message poison.
	Error string `json:"error"`
}

// deadLetter writes d's poison message, with cause, into the dead-letter
// outbox in a transaction of its own, committed before the message is
// acked. The row's message key is the message's key where it could be read
// (and the outbox accepts it), else a digest of the body and metadata: the
// same on every delivery, so a message dead-lettered again finds its row
// (outbox.ErrDuplicateKey) and writes none.
func (c *Consumer) deadLetter(ctx context.Context, d delivery, cause error) error {
	dl := DeadLetter{Body: d.m.Body, Metadata: d.m.Metadata, LoggableID: d.m.LoggableID, Error: cause.Error()}
	key := d.msg.Key
	if key == "" {
		key = digest(d.m)
	}
	err := c.dead.Write(ctx, key, dl, d.msg.EventTime)
	if errors.Is(err, outbox.ErrInvalidKey) && key == d.msg.Key {
		// A key the outbox refuses (too long, not UTF-8, a NUL): the
		// delivery's digest instead.
		err = c.dead.Write(ctx, digest(d.m), dl, d.msg.EventTime)
	}
	if err != nil {
		return fmt.Errorf("cdkpubsub: dead letter %s: %w", d.m.LoggableID, err)
	}
	return nil
}

// digest is the dead-letter key of a message whose key is unknown: a
// SHA-256 over its body and its metadata in key order.
func digest(m *pubsub.Message) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(m.Metadata)) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(m.Metadata[k]), m.Metadata[k])
	}
	fmt.Fprintf(h, "%d:", len(m.Body))
	h.Write(m.Body)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// DeadLetterSender returns the outbox Sender that publishes the dead
// letters of WithDeadLetter to topic: the poison message's body and
// metadata, plus DeadLetterIDMetadata, DeadLetterErrorMetadata and
// DeadLetterSourceMetadata. Register it for the kind given to
// WithDeadLetter. The event time travels with it: the row holds the
// message's event time as the Consumer read it, and the dead letter carries
// it in the adapter.EventTimeHeader metadata key, in place of the
// original's, so that a replay from the dead-letter topic is claimed under
// the original event time; a message that had none keeps its metadata as
// it was (a malformed event time among it). The message's key metadata is
// kept, so the replay is claimed under the original key too. A relay may
// publish a dead letter more than once (after a lost acknowledgement);
// each copy carries the same DeadLetterIDMetadata. A payload that is not a
// DeadLetter fails permanently.
func DeadLetterSender(topic *pubsub.Topic) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if topic == nil {
			return outbox.Permanent(errors.New("cdkpubsub: DeadLetterSender: nil topic"))
		}
		var d DeadLetter
		if err := json.Unmarshal(m.Payload, &d); err != nil {
			return outbox.Permanent(fmt.Errorf("cdkpubsub: outbox row %d is not a dead letter: %w", m.ID, err))
		}
		md := replayMetadata(d, m)
		md[DeadLetterIDMetadata] = m.IdempotencyKey
		md[DeadLetterErrorMetadata] = d.Error
		md[DeadLetterSourceMetadata] = d.LoggableID
		if err := topic.Send(ctx, &pubsub.Message{Body: body(d), Metadata: md}); err != nil {
			return fmt.Errorf("cdkpubsub: publish dead letter of outbox row %d: %w", m.ID, err)
		}
		return nil
	})
}

// replayMetadata returns a copy of d's metadata with m's event time, when it has
// one, in the adapter.EventTimeHeader key in place of the message's own.
func replayMetadata(d DeadLetter, m outbox.Message) map[string]string {
	md := make(map[string]string, len(d.Metadata)+4)
	maps.Copy(md, d.Metadata)
	maps.Copy(md, m.Trace) // the relay's send span, in place of the original's
	if !m.EventTime.IsZero() {
		md[adapter.EventTimeHeader] = adapter.FormatEventTime(m.EventTime)
	}
	return md
}

// body is d's body, empty rather than nil.
func body(d DeadLetter) []byte {
	if d.Body == nil {
		return []byte{}
	}
	return d.Body
}

// ReplayIDMetadata carries a replay's outbox idempotency key, the same on
// every copy a relay publishes of one replay.
const ReplayIDMetadata = "dead-letter-replay-id"

// ReplaySender returns the outbox Sender that publishes the replays
// deadletter.Store.Replay writes for the kind given to WithDeadLetter
// (their kind is deadletter.ReplayKind(kind)) to topic — the topic the
// poison messages came from, which a DeadLetter does not record: the
// message's body and metadata, with the event time the Consumer read in
// the adapter.EventTimeHeader key in place of the original's (as
// DeadLetterSender does), plus ReplayIDMetadata. The Consumer reads the
// message key from the same metadata as before, so a replay of a message
// applied since is a Duplicate. A payload that is not a DeadLetter fails
// permanently.
func ReplaySender(topic *pubsub.Topic) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if topic == nil {
			return outbox.Permanent(errors.New("cdkpubsub: ReplaySender: nil topic"))
		}
		var d DeadLetter
		if err := json.Unmarshal(m.Payload, &d); err != nil {
			return outbox.Permanent(fmt.Errorf("cdkpubsub: outbox row %d is not a dead letter to replay: %w", m.ID, err))
		}
		md := replayMetadata(d, m)
		md[ReplayIDMetadata] = m.IdempotencyKey
		if err := topic.Send(ctx, &pubsub.Message{Body: body(d), Metadata: md}); err != nil {
			return fmt.Errorf("cdkpubsub: publish replay of outbox row %d: %w", m.ID, err)
		}
		return nil
	})
}
