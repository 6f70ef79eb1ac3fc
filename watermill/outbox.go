package watermill

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// An Outbox writes the messages a [Handler] produces into an outbox.Outbox,
// as rows of one kind, in the claim's transaction: they go out if and only
// if the effect commits, at least once, each under an identity of its own
// that every relay retry repeats. An outbox.Relay publishes them with a
// [Sender] registered for the kind:
//
//	awards, err := idwm.NewOutbox(ob, "points_awarded")
//	…
//	h, err := idwm.NewHandler(mw, func(ctx context.Context, tx *sql.Tx, msg *message.Message) error {
//		…
//		return awards.Publish(ctx, tx, msg, message.NewMessage(watermill.NewUUID(), payload))
//	})
//	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", idwm.NewSender(pub, "points")))
//
// The handler returns no messages to the router, whose publish would come
// after the commit and before the ack: if that publish failed, the
// redelivery would be a duplicate and the messages would never go out.
type Outbox struct {
	ob   *outbox.Outbox
	kind string
}

// NewOutbox returns an Outbox that writes rows of kind into ob. The
// relay's Sender for kind must be a [Sender].
func NewOutbox(ob *outbox.Outbox, kind string) (*Outbox, error) {
	if ob == nil {
		return nil, errors.New("watermill: NewOutbox: nil outbox")
	}
	if kind == "" {
		return nil, errors.New("watermill: NewOutbox: empty kind")
	}
	return &Outbox{ob: ob, kind: kind}, nil
}

// Publish writes msgs, with their metadata and payloads, as rows in tx,
// the claim's transaction of from, the message being handled. Each row's
// idempotency key — the UUID the Sender publishes it with — is derived
// from the consumer, from's UUID and the produced message's UUID, and
// stored with the row, so every relay retry publishes the same: give two
// messages of one call different UUIDs (a second with the same fails with
// outbox.ErrDuplicateKey). A message whose metadata has
// adapter.EventTimeHeader keeps that event time; one without is published
// with the time the claim's transaction wrote its row. A failure leaves tx
// to be rolled back: return it from the handler.
func (o *Outbox) Publish(ctx context.Context, tx *sql.Tx, from *message.Message, msgs ...*message.Message) error {
	if from == nil || from.UUID == "" {
		return errors.New("watermill: Outbox.Publish: no message being handled (nil, or an empty UUID)")
	}
	for i, p := range msgs {
		if p == nil || p.UUID == "" {
			return fmt.Errorf("watermill: Outbox.Publish: message %d of %s: nil, or an empty UUID", i, from.UUID)
		}
		var opts []outbox.EnqueueOption
		if v := p.Metadata.Get(adapter.EventTimeHeader); v != "" {
			at, err := adapter.ParseEventTime(v)
			if err != nil {
				return fmt.Errorf("watermill: Outbox.Publish: message %s of %s: %w", p.UUID, from.UUID, err)
			}
			opts = append(opts, outbox.WithEventTime(at))
		}
		payload, err := json.Marshal(envelope{Metadata: p.Metadata, Payload: p.Payload})
		if err != nil {
			return fmt.Errorf("watermill: Outbox.Publish: encode message %s of %s: %w", p.UUID, from.UUID, err)
		}
		rowKey := outbox.Key(o.ob.Consumer(), from.UUID+"/"+p.UUID, o.kind)
		if _, err := o.ob.Enqueue(ctx, tx, from.UUID, o.kind, payload, append(opts, outbox.WithKey(rowKey))...); err != nil {
			return fmt.Errorf("watermill: Outbox.Publish: message %s of %s: %w", p.UUID, from.UUID, err)
		}
	}
	return nil
}

// envelope is a produced message as an outbox row carries it.
type envelope struct {
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}
