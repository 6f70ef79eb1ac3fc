package nats

import (
	"context"
	"errors"
	"fmt"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// DeadLetterKind is the outbox kind of dead-lettered messages
// (WithDeadLetter); register DeadLetterSender for it on the Relay.
const DeadLetterKind = "nats-dead-letter"

// ReplayKind is the outbox kind of the replays of dead letters
// (deadletter.ReplayKind(DeadLetterKind)); register ReplaySender for it on
// the Relay.
const ReplayKind = DeadLetterKind + "-replay"

// Headers the senders add to a dead letter or a replay, beside the
// message's own headers.
const (
	// DeadLetterIDHeader carries the dead-letter outbox row's idempotency
	// key, the same on every copy a relay publishes of one dead letter.
	DeadLetterIDHeader = "Dead-Letter-Id"
	// DeadLetterSourceHeader carries "<stream>/<consumer>/<stream
	// sequence>" of the poison delivery.
	DeadLetterSourceHeader = "Dead-Letter-Source"
	// DeadLetterErrorHeader carries the error that made the message poison.
	DeadLetterErrorHeader = "Dead-Letter-Error"
	// ReplayIDHeader carries a replay's outbox idempotency key, the same on
	// every copy a relay publishes of one replay.
	ReplayIDHeader = "Dead-Letter-Replay-Id"
)

// deadLetter writes d's poison message, with cause, into the dead-letter
// outbox in a transaction of the Middleware's, committed before the
// message is terminated. Its key is the delivery's place in the stream, the
// one identity every message has (a poison message may have no key): a
// message dead-lettered again, its Term lost, finds its row and writes none.
func (w worker) deadLetter(ctx context.Context, d delivery, cause error) error {
	m := d.m
	dm := adapter.DeadMessage{Destination: w.c.cfg.deadSubject, Source: m.Subject(), Origin: d.source,
		Deliveries: d.attempt, Headers: m.Headers(), Body: m.Data(), Error: fmt.Sprint(cause)}
	if err := w.c.dead.Write(ctx, d.source, dm, d.msg.EventTime); err != nil {
		return fmt.Errorf("nats: dead letter %s: %w", d.source, err)
	}
	return nil
}

// publish publishes d's body to subject with headers h, and fails when the
// stream saw the message id already (its duplicate window).
func publish(ctx context.Context, js jetstream.JetStream, subject string, h map[string][]string, body []byte) error {
	msg := &natsgo.Msg{Subject: subject, Header: natsgo.Header(h), Data: body}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return err
	}
	if ack.Duplicate {
		return fmt.Errorf("stream %s holds message id %q in its duplicate window: published again once the window has passed", ack.Stream, msg.Header.Get(natsgo.MsgIdHdr))
	}
	return nil
}

// DeadLetterSender returns the outbox Sender that publishes the dead
// letters of WithDeadLetter to their dead-letter subject with js: the
// message's data and headers, plus DeadLetterIDHeader,
// DeadLetterSourceHeader and DeadLetterErrorHeader. The event time travels
// with it in the adapter.EventTimeHeader header, in place of the
// original's. A message without a Nats-Msg-Id header gets the row's
// idempotency key as one, so that the dead-letter stream drops a relay's
// repeats within its duplicate window. A payload that is not a dead letter
// fails permanently.
func DeadLetterSender(js jetstream.JetStream) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if js == nil {
			return outbox.Permanent(errors.New("nats: DeadLetterSender: nil JetStream"))
		}
		d, err := adapter.ParseDeadLetter("nats", m)
		if err != nil {
			return err
		}
		h := d.ReplayHeaders(m)
		if len(h[natsgo.MsgIdHdr]) == 0 {
			h[natsgo.MsgIdHdr] = []string{m.IdempotencyKey}
		}
		h[DeadLetterIDHeader] = []string{m.IdempotencyKey}
		h[DeadLetterSourceHeader] = []string{d.Origin}
		h[DeadLetterErrorHeader] = []string{d.Error}
		if err := publish(ctx, js, d.Destination, h, d.Body); err != nil {
			return fmt.Errorf("nats: publish dead letter of outbox row %d to %s: %w", m.ID, d.Destination, err)
		}
		return nil
	})
}

// ReplaySender returns the outbox Sender that publishes the replays
// deadletter.Store.Replay writes (kind ReplayKind) back to the subject the
// poison message was published to, with js: its data and headers — the
// key header or Nats-Msg-Id among them, so a replay of a message applied
// since is a Duplicate — with the event time the Consumer read in the
// adapter.EventTimeHeader header (as DeadLetterSender does), plus
// ReplayIDHeader. A message without a Nats-Msg-Id gets the replay's
// idempotency key as one. A message whose Nats-Msg-Id the stream still
// holds in its duplicate window (two minutes by default) would be dropped
// by the server: the send fails and the relay retries it after its backoff
// until the window has passed (the default backoff outlasts the default
// window many times; a row whose attempts run out first is given up, and
// the dead letter can be replayed again). A payload that is not a dead letter fails
// permanently.
func ReplaySender(js jetstream.JetStream) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if js == nil {
			return outbox.Permanent(errors.New("nats: ReplaySender: nil JetStream"))
		}
		d, err := adapter.ParseDeadLetter("nats", m)
		if err != nil {
			return err
		}
		h := d.ReplayHeaders(m)
		if len(h[natsgo.MsgIdHdr]) == 0 {
			h[natsgo.MsgIdHdr] = []string{m.IdempotencyKey}
		}
		h[ReplayIDHeader] = []string{m.IdempotencyKey}
		if err := publish(ctx, js, d.Source, h, d.Body); err != nil {
			return fmt.Errorf("nats: replay %s to %s: %w", d.Origin, d.Source, err)
		}
		return nil
	})
}
