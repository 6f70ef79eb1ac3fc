package redisstream

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// DeadLetterKind is the outbox kind of dead-lettered entries; register
// DeadLetterSender for it on the Relay.
const DeadLetterKind = "redisstream-dead-letter"

// Fields DeadLetterSender adds to a dead-lettered entry, beside the
// original entry's own fields.
const (
	// DeadLetterIDField carries the outbox row's idempotency key, the same
	// on every copy a relay adds of one dead letter: the dead-letter
	// stream's readers drop repeats by it.
	DeadLetterIDField = "dead-letter-id"
	// DeadLetterSourceField carries "<stream>/<group>/<id>" of the original
	// entry.
	DeadLetterSourceField = "dead-letter-source"
	// DeadLetterErrorField carries the error that made the entry poison.
	DeadLetterErrorField = "dead-letter-error"
)

// DeadLetter is the payload of a dead-letter outbox row: a poison entry,
// field for field, and why it was poison.
type DeadLetter struct {
	// Stream is the dead-letter stream to add it to.
	Stream string `json:"stream"`
	// SourceStream, Group and ID locate the original entry.
	SourceStream string `json:"source_stream"`
	Group        string `json:"group"`
	ID           string `json:"id"`
	// Values are the entry's fields.
	Values map[string]string `json:"values"`
	// Error is the error that made the entry poison.
	Error string `json:"error"`
}

// Dropped is the Detail of an adapter.EventDeadLettered whose poison
// entry was acknowledged and dropped, there being no dead-letter outbox
// (WithDeadLetter): nothing of it remains but the event.
type Dropped struct {
	// Delivery is the dropped delivery.
	Delivery *Delivery
}

// deadLetter writes the poison delivery d (its message msg as far as it
// was read) into the dead-letter outbox, in a transaction of the
// Middleware's, under the entry's place in the group — the one identity
// every entry has: a poison entry may have no key — with its event time.
func (r *run) deadLetter(ctx context.Context, d *Delivery, msg idempotent.Message, cause error) error {
	place := r.source + "/" + d.ID
	dl := DeadLetter{Stream: r.c.cfg.deadStream, SourceStream: r.stream, Group: r.group, ID: d.ID, Values: d.Values, Error: fmt.Sprint(cause)}
	// A row already there was dead-lettered before, its XACK lost.
	if err := r.c.dead.Write(ctx, place, dl, msg.EventTime); err != nil {
		return fmt.Errorf("redisstream: dead letter %s: %w", place, err)
	}
	return nil
}

// DeadLetterSender returns the outbox Sender that adds dead letters to
// their dead-letter stream with client: the original entry's fields, plus
// DeadLetterIDField, DeadLetterSourceField and DeadLetterErrorField. The
// event time travels with it: the outbox row holds the entry's event time
// as the Consumer read it (its adapter.EventTimeHeader field, WithEventTime's
// function, or its id's time with WithTransportEventTime), and the dead
// letter carries it in the adapter.EventTimeHeader field, in place of the
// original's, so that a replay from the dead-letter stream is claimed under
// the original event time. An entry that had none keeps its fields as they
// were (a malformed event-time field among them). A relay may add a dead
// letter more than once (after a lost reply); each copy carries the same
// DeadLetterIDField. A payload that is not a DeadLetter fails permanently.
func DeadLetterSender(client redis.UniversalClient) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		var d DeadLetter
		if err := json.Unmarshal(m.Payload, &d); err != nil || d.Stream == "" {
			return outbox.Permanent(fmt.Errorf("redisstream: outbox row %d is not a dead letter: %v", m.ID, err))
		}
		vals := fields(d.Values, m, DeadLetterIDField, DeadLetterSourceField, DeadLetterErrorField)
		vals = append(vals, DeadLetterIDField, m.IdempotencyKey,
			DeadLetterSourceField, d.SourceStream+"/"+d.Group+"/"+d.ID, DeadLetterErrorField, d.Error)
		if err := client.XAdd(ctx, &redis.XAddArgs{Stream: d.Stream, Values: vals}).Err(); err != nil {
			return fmt.Errorf("redisstream: add dead letter to %q: %w", d.Stream, err)
		}
		return nil
	})
}

// fields returns the entry's fields, sorted, for XADD: without those named
// in drop, and with m's event time, when it has one, in the
// adapter.EventTimeHeader field in place of the entry's own.
func fields(values map[string]string, m outbox.Message, drop ...string) []any {
	vals := make([]any, 0, 2*len(values)+8)
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if slices.Contains(drop, k) || (!m.EventTime.IsZero() && k == adapter.EventTimeHeader) {
			continue
		}
		if _, ok := m.Trace[k]; ok {
			continue // the relay's send span, in place of the original's
		}
		vals = append(vals, k, values[k])
	}
	for _, k := range slices.Sorted(maps.Keys(m.Trace)) {
		vals = append(vals, k, m.Trace[k])
	}
	if !m.EventTime.IsZero() {
		vals = append(vals, adapter.EventTimeHeader, adapter.FormatEventTime(m.EventTime))
	}
	return vals
}

// ReplayKind is the outbox kind of the replays of dead letters
// (deadletter.ReplayKind(DeadLetterKind)); register ReplaySender for it on
// the Relay.
const ReplayKind = DeadLetterKind + "-replay"

// ReplayIDField carries a replay's outbox idempotency key, the same on
// every copy a relay adds of one replay.
const ReplayIDField = "dead-letter-replay-id"

// ReplaySender returns the outbox Sender that adds the replays
// deadletter.Store.Replay writes (a DeadLetter as payload) back to their
// source stream with client: the original entry's fields, with the event
// time the Consumer read in the adapter.EventTimeHeader field in place of
// the original's (as DeadLetterSender does), plus ReplayIDField. The
// Consumer reads the message key from the same field as before, so a
// replay of an entry applied since is a Duplicate. A payload that is not a
// DeadLetter fails permanently.
func ReplaySender(client redis.UniversalClient) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		var d DeadLetter
		if err := json.Unmarshal(m.Payload, &d); err != nil || d.SourceStream == "" {
			return outbox.Permanent(fmt.Errorf("redisstream: outbox row %d is not a dead letter to replay: %v", m.ID, err))
		}
		vals := append(fields(d.Values, m, ReplayIDField), ReplayIDField, m.IdempotencyKey)
		if err := client.XAdd(ctx, &redis.XAddArgs{Stream: d.SourceStream, Values: vals}).Err(); err != nil {
			return fmt.Errorf("redisstream: replay %s/%s/%s: %w", d.SourceStream, d.Group, d.ID, err)
		}
		return nil
	})
}
