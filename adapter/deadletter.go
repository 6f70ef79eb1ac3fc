package adapter

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/outbox"
)

// DeadMessage is the payload of the dead-letter outbox rows of the
// transports whose message is a body and headers (NATS, RabbitMQ): the
// poison message, byte for byte, where it came from, and why it was poison.
// Package deadletter lists, shows, replays and discards them.
type DeadMessage struct {
	// Destination is where the transport's DeadLetterSender sends it: a
	// NATS subject, an AMQP exchange; DestinationKey the AMQP routing key.
	Destination    string `json:"destination"`
	DestinationKey string `json:"destination_key,omitempty"`
	// Source is where the message was published, and where a replay goes:
	// the NATS subject, the AMQP exchange ("" for the default exchange);
	// SourceKey the AMQP routing key.
	Source    string `json:"source"`
	SourceKey string `json:"source_key,omitempty"`
	// Queue is the AMQP queue the message was consumed from: a replay is
	// published to it through the default exchange, reaching that queue
	// alone.
	Queue string `json:"queue,omitempty"`
	// Origin locates the poison delivery, for logs:
	// "stream/consumer/sequence", "queue/message key".
	Origin string `json:"origin"`
	// Deliveries is how many times the transport had delivered the message
	// when it was dead-lettered.
	Deliveries int `json:"deliveries"`
	// MessageID is the AMQP message id property ("" on NATS, whose message
	// id is the Nats-Msg-Id header).
	MessageID string `json:"message_id,omitempty"`
	// ContentType is the AMQP content type property.
	ContentType string `json:"content_type,omitempty"`
	// Headers are the message's headers, each with its values in order.
	Headers map[string][]string `json:"headers,omitempty"`
	// Body is the message's body.
	Body []byte `json:"body"`
	// Error is the error that made the message poison.
	Error string `json:"error"`
}

// ReplayHeaders returns a copy of the headers of d for a send of it by the
// outbox relay, as message m: with m's trace context in place of the
// message's own, and m's event time, when it has one, in EventTimeHeader in
// place of the message's. drop names headers left out.
func (d DeadMessage) ReplayHeaders(m outbox.Message, drop ...string) map[string][]string {
	h := make(map[string][]string, len(d.Headers)+len(m.Trace)+4)
	maps.Copy(h, d.Headers)
	for _, k := range drop {
		delete(h, k)
	}
	for k, v := range m.Trace {
		h[k] = []string{v} // the relay's send span, in place of the original's
	}
	if !m.EventTime.IsZero() {
		h[EventTimeHeader] = []string{FormatEventTime(m.EventTime)}
	}
	return h
}

// ParseDeadLetter reads m's payload as a DeadMessage; a payload that is not
// one (or names no origin) is a permanent error of who.
func ParseDeadLetter(who string, m outbox.Message) (DeadMessage, error) {
	var d DeadMessage
	if err := json.Unmarshal(m.Payload, &d); err != nil || d.Origin == "" {
		return d, outbox.Permanent(fmt.Errorf("%s: outbox row %d is not a dead letter: %v", who, m.ID, err))
	}
	return d, nil
}

// DeadLetters writes an adapter's poison messages into a dead-letter
// outbox, each in a transaction of the Middleware's committed before the
// adapter acknowledges (or terminates) the message: the adapters'
// WithDeadLetter options are built on it.
type DeadLetters struct {
	ob   *outbox.Outbox
	kind string
	path *Path
}

// NewDeadLetters returns the dead-letter writer of ob for rows of kind, in
// transactions of mw. It fails for a nil mw (the tenants' case: the outbox
// is one database's and each tenant has its own) and for a Middleware whose
// dialect the outbox does not support; who names the adapter in errors.
func NewDeadLetters(who string, mw *idempotent.Middleware, ob *outbox.Outbox, kind string) (*DeadLetters, error) {
	if ob == nil {
		return nil, fmt.Errorf("%s: WithDeadLetter: nil outbox", who)
	}
	if mw == nil {
		return nil, fmt.Errorf("%s: WithDeadLetter with WithTenant: the dead-letter outbox is one database's, and each tenant has its own", who)
	}
	if err := outbox.CheckDialect(mw.Config().Dialect); err != nil {
		return nil, fmt.Errorf("%s: WithDeadLetter: %w", who, err)
	}
	if err := outbox.CheckKind(kind); err != nil {
		return nil, fmt.Errorf("%s: WithDeadLetter: %w", who, err)
	}
	p, err := NewPath(mw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	return &DeadLetters{ob: ob, kind: kind, path: p}, nil
}

// Write writes payload (JSON-encoded) under key, with event time at (none
// when zero), in a transaction of its own, and returns once it committed.
// A row already there under key (dead-lettered before, its
// acknowledgement lost) is not written again.
func (w *DeadLetters) Write(ctx context.Context, key string, payload any, at time.Time) error {
	return w.path.Tx(ctx, func(ctx context.Context, tx *sql.Tx) error { return w.WriteTx(ctx, tx, key, payload, at) })
}

// WriteTx is Write in the caller's transaction tx.
func (w *DeadLetters) WriteTx(ctx context.Context, tx *sql.Tx, key string, payload any, at time.Time) error {
	return WriteDeadLetter(ctx, tx, w.ob, key, w.kind, payload, at)
}

// WriteDeadLetter writes payload (JSON-encoded) into ob in tx, under key
// and kind, with event time at (none when zero); a row already there under
// key is not written again (nil).
func WriteDeadLetter(ctx context.Context, tx *sql.Tx, ob *outbox.Outbox, key, kind string, payload any, at time.Time) error {
	raw, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	var opts []outbox.EnqueueOption
	if !at.IsZero() {
		opts = append(opts, outbox.WithEventTime(at))
	}
	if _, err := ob.Enqueue(ctx, tx, key, kind, raw, opts...); err != nil && !errors.Is(err, outbox.ErrDuplicateKey) {
		return err
	}
	return nil
}
