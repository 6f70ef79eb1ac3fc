package nats

import (
	"errors"
	"fmt"

	"github.com/txclaim/idempotent"
)

// Errors callers branch on; match them with errors.Is.
var (
	// ErrPoison marks an error as poison: redelivering the message would
	// fail the same way, so the Consumer terminates it (Term) instead of
	// asking for a redelivery. Mark a handler's own errors with [Poison].
	ErrPoison = errors.New("nats: poison message")

	// ErrUndecodable reports a message whose data the decode function of
	// [Decode] (or the JSON parsing of [BodyField]) could not decode. It
	// matches ErrPoison.
	ErrUndecodable = fmt.Errorf("%w: undecodable data", ErrPoison)

	// ErrNoKey reports a message that carries no message key where its
	// KeyFunc looks: no Nats-Msg-Id header, a missing header, a missing body
	// field. It matches idempotent.ErrInvalidKey, so the message is poison.
	ErrNoKey = fmt.Errorf("%w: message carries no message key", idempotent.ErrInvalidKey)

	// ErrConnectionClosed is returned by Consumer.Run when the NATS
	// connection under the consumer was closed (nats.Conn.Close, or the
	// client gave up reconnecting). Messages that were not acked are
	// redelivered after the consumer's AckWait; connect again and call Run.
	// A connection that is only reconnecting does not end Run: it retries.
	ErrConnectionClosed = errors.New("nats: connection closed")

	// ErrConsumerGone is returned by Consumer.Run when the JetStream
	// consumer, or its stream, no longer exists on the server (it was
	// deleted, or an inactivity threshold removed it).
	ErrConsumerGone = errors.New("nats: JetStream consumer is gone")

	// ErrNotDurable is returned by Consumer.Run for a JetStream consumer
	// that is not a durable pull consumer with explicit acks, the only kind
	// on which late acknowledgement means anything.
	ErrNotDurable = errors.New("nats: not a durable pull consumer with AckExplicit")
)

// Poison marks err as poison, so that a Consumer terminates the message
// instead of asking for a redelivery: return Poison(err) from a handler for a
// message that can never be applied, such as one naming a customer that does
// not exist. The result matches both ErrPoison and err. Poison(nil) is nil.
func Poison(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPoison, err)
}

// IsPoison is the default poison predicate. It reports whether err matches
// ErrPoison: ErrUndecodable and errors marked with Poison, this package's
// own marks. The Middleware's errors — an invalid key (which includes
// ErrNoKey), a message too old for the retention window, an event time
// missing where one is needed or dated too far in the future — are settled
// by adapter.Rule, the rule every adapter shares, before any predicate is
// asked. It classifies by the public error values only, never by message
// text. A Consumer consults it, then any predicates added with WithPoison,
// for an error the rule would requeue.
func IsPoison(err error) bool {
	return errors.Is(err, ErrPoison)
}
