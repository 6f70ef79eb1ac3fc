package rabbitmq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// DeadLetterKind is the outbox kind of dead-lettered deliveries
// (WithDeadLetter); register DeadLetterSender for it on the Relay.
const DeadLetterKind = "rabbitmq-dead-letter"

// ReplayKind is the outbox kind of the replays of dead letters
// (deadletter.ReplayKind(DeadLetterKind)); register ReplaySender for it on
// the Relay.
const ReplayKind = DeadLetterKind + "-replay"

// Headers the senders add to a dead letter or a replay, beside the
// message's own headers.
const (
	// DeadLetterIDHeader carries the dead-letter outbox row's idempotency
	// key, the same on every copy a relay publishes of one dead letter:
	// the dead-letter queue's readers drop repeats by it.
	DeadLetterIDHeader = "dead-letter-id"
	// DeadLetterSourceHeader carries "<queue>/<message key>" of the poison
	// delivery.
	DeadLetterSourceHeader = "dead-letter-source"
	// DeadLetterErrorHeader carries the error that made the message poison.
	DeadLetterErrorHeader = "dead-letter-error"
	// ReplayIDHeader carries a replay's outbox idempotency key, the same on
	// every copy a relay publishes of one replay.
	ReplayIDHeader = "dead-letter-replay-id"
)

// Publisher publishes with publisher confirms: an *amqp091.Channel put in
// confirm mode (Channel.Confirm). The senders wait for each confirmation.
type Publisher interface {
	PublishWithDeferredConfirmWithContext(ctx context.Context, exchange, key string, mandatory, immediate bool, msg amqp.Publishing) (*amqp.DeferredConfirmation, error)
}

// deadLetter writes x's poison delivery, from queue, into the dead-letter
// outbox in a transaction of the Middleware's, committed before the
// delivery is acked. Its key is the queue and the message key, or a digest
// of the body and headers when the key could not be read: the same on
// every delivery, so a message dead-lettered again, its ack lost, finds its
// row and writes none.
func (c *Consumer) deadLetter(ctx context.Context, queue string, x result) error {
	d := x.d
	key := x.msg.Key
	if key == "" {
		key = digest(d)
	}
	origin := queue + "/" + key
	dm := adapter.DeadMessage{Destination: c.cfg.deadExchange, DestinationKey: c.cfg.deadKey,
		Source: d.Exchange, SourceKey: d.RoutingKey, Queue: queue, Origin: origin, Deliveries: attempt(d),
		MessageID: d.MessageId, ContentType: d.ContentType, Headers: headers(d.Headers), Body: d.Body, Error: fmt.Sprint(x.err)}
	err := c.dead.Write(ctx, origin, dm, x.msg.EventTime)
	if err != nil && key == x.msg.Key && errors.Is(err, outbox.ErrInvalidKey) {
		origin = queue + "/" + digest(d) // a key the outbox refuses: the digest instead
		dm.Origin = origin
		err = c.dead.Write(ctx, origin, dm, x.msg.EventTime)
	}
	if err != nil {
		return fmt.Errorf("rabbitmq: dead letter %s: %w", origin, err)
	}
	return nil
}

// headers returns an AMQP header table as text: strings and byte strings
// as they are, other values as fmt prints them.
func headers(t amqp.Table) map[string][]string {
	if len(t) == 0 {
		return nil
	}
	h := make(map[string][]string, len(t))
	for k, v := range t {
		switch v := v.(type) {
		case string:
			h[k] = []string{v}
		case []byte:
			h[k] = []string{string(v)}
		default:
			h[k] = []string{fmt.Sprint(v)}
		}
	}
	return h
}

// digest is the dead-letter key of a delivery whose key is unknown: a
// SHA-256 over its message id, body and headers in key order.
func digest(d *amqp.Delivery) string {
	hs := headers(d.Headers)
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s", len(d.MessageId), d.MessageId)
	keys := make([]string, 0, len(hs))
	for k := range hs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(hs[k][0]), hs[k][0])
	}
	fmt.Fprintf(h, "%d:", len(d.Body))
	h.Write(d.Body)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// publishing is dm as a persistent message with headers h.
func publishing(dm adapter.DeadMessage, h map[string][]string) amqp.Publishing {
	t := make(amqp.Table, len(h))
	for k, v := range h {
		if strings.HasPrefix(k, "x-") {
			continue // the broker's (x-death, x-delivery-count): not the message's
		}
		t[k] = v[0]
	}
	return amqp.Publishing{MessageId: dm.MessageID, ContentType: dm.ContentType, DeliveryMode: amqp.Persistent, Headers: t, Body: dm.Body}
}

// confirm publishes msg with p and waits for the broker's confirmation.
func confirm(ctx context.Context, p Publisher, exchange, key string, msg amqp.Publishing) error {
	dc, err := p.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		return err
	}
	if dc == nil {
		return outbox.Permanent(errors.New("the channel is not in confirm mode (call Confirm on it)"))
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("the broker refused it (nack)")
	}
	return nil
}

// DeadLetterSender returns the outbox Sender that publishes the dead
// letters of WithDeadLetter to their exchange and routing key with p, and
// waits for the broker's confirmation: the message's body, message id,
// content type and headers (less the broker's x- headers), plus
// DeadLetterIDHeader, DeadLetterSourceHeader and DeadLetterErrorHeader. The
// event time travels with it in the adapter.EventTimeHeader header, in
// place of the original's. A relay may publish a dead letter more than once
// (after a lost confirmation); each copy carries the same
// DeadLetterIDHeader. A payload that is not a dead letter fails
// permanently.
func DeadLetterSender(p Publisher) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if p == nil {
			return outbox.Permanent(errors.New("rabbitmq: DeadLetterSender: nil Publisher"))
		}
		dm, err := adapter.ParseDeadLetter("rabbitmq", m)
		if err != nil {
			return err
		}
		msg := publishing(dm, dm.ReplayHeaders(m))
		msg.Headers[DeadLetterIDHeader] = m.IdempotencyKey
		msg.Headers[DeadLetterSourceHeader] = dm.Origin
		msg.Headers[DeadLetterErrorHeader] = dm.Error
		if err := confirm(ctx, p, dm.Destination, dm.DestinationKey, msg); err != nil {
			return fmt.Errorf("rabbitmq: publish dead letter of outbox row %d to exchange %q: %w", m.ID, dm.Destination, err)
		}
		return nil
	})
}

// ReplaySender returns the outbox Sender that publishes the replays
// deadletter.Store.Replay writes (kind ReplayKind) back to the queue the
// poison message was consumed from, through the default exchange (so it
// reaches that queue alone, not every queue of its exchange), with p, and
// waits for the broker's confirmation: its body, message id, content type
// and headers (less the broker's x- headers) — the message key among them,
// so a replay of a message applied since is a Duplicate — with the event
// time the Consumer read in the adapter.EventTimeHeader header, plus
// ReplayIDHeader. A payload that is not a dead letter fails permanently.
func ReplaySender(p Publisher) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if p == nil {
			return outbox.Permanent(errors.New("rabbitmq: ReplaySender: nil Publisher"))
		}
		dm, err := adapter.ParseDeadLetter("rabbitmq", m)
		if err != nil {
			return err
		}
		if dm.Queue == "" {
			return outbox.Permanent(fmt.Errorf("rabbitmq: outbox row %d is a dead letter without its queue", m.ID))
		}
		msg := publishing(dm, dm.ReplayHeaders(m))
		msg.Headers[ReplayIDHeader] = m.IdempotencyKey
		if err := confirm(ctx, p, "", dm.Queue, msg); err != nil {
			return fmt.Errorf("rabbitmq: replay %s to queue %q: %w", dm.Origin, dm.Queue, err)
		}
		return nil
	})
}
