package rabbitmq

import (
	"errors"
	"fmt"

	"github.com/txclaim/idempotent"
)

// Errors callers branch on; match them with errors.Is.
var (
	// ErrPoison marks an error as poison: redelivering the message would
	// fail the same way, so the consumer rejects it without requeue and the
	// broker dead-letters it. Mark a handler's own errors with [Poison].
	ErrPoison = errors.New("rabbitmq: poison message")

	// ErrUndecodable reports a body that the decode function of [Decode]
	// (or the JSON parsing of [BodyField]) could not decode. It matches
	// ErrPoison.
	ErrUndecodable = fmt.Errorf("%w: undecodable body", ErrPoison)

	// ErrNoKey reports a delivery that carries no message key where its
	// KeyFunc looks: an empty message_id, a missing header, a missing body
	// field. It matches idempotent.ErrInvalidKey, so the delivery is poison.
	ErrNoKey = fmt.Errorf("%w: delivery carries no message key", idempotent.ErrInvalidKey)

	// ErrChannelClosed is returned by Consumer.Run when the channel, or the
	// connection under it, closed while consuming. The error also wraps the
	// broker's *amqp091.Error when there was one (match it with errors.As).
	// Deliveries that were not acked return to the queue; open a new channel
	// and call Run again.
	ErrChannelClosed = errors.New("rabbitmq: channel closed")

	// ErrConsumerCancelled is returned by Consumer.Run when the broker
	// cancelled the consumer while the channel stayed open, as RabbitMQ
	// does when the queue is deleted.
	ErrConsumerCancelled = errors.New("rabbitmq: consumer cancelled by the broker")
)

// Poison marks err as poison, so that a Consumer rejects the message without
// requeue instead of retrying it: return Poison(err) from a handler for a
// message that can never be applied, such as one naming a customer that does
// not exist. The result matches both ErrPoison and err. Poison(nil) is nil.
func Poison(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPoison, err)
}

// IsPoison is the default poison predicate: it reports whether err matches
// ErrPoison (which includes ErrUndecodable and errors marked with Poison),
// idempotent.ErrInvalidKey (which includes ErrNoKey),
// idempotent.ErrBeyondRetention (a message older than the retention window,
// whose claim may already be gone: applying it could double its effect) or
// idempotent.ErrInvalidEventTime (an event time that is zero or in the
// future beyond the clock-skew margin: a producer bug that redelivery cannot
// fix). A Consumer consults it first, then any predicates added with
// WithPoison.
//
// What is not yet possible is not poison, and is requeued after the requeue
// delay: idempotent.ErrNoPartition (in partitioned mode, the event day's
// partition is not created yet), idempotent.ErrClaimBusy (another delivery
// holds the claim) and idempotent.ErrRetriesExhausted (the database kept
// failing with retryable errors).
func IsPoison(err error) bool {
	return errors.Is(err, ErrPoison) || errors.Is(err, idempotent.ErrInvalidKey) ||
		errors.Is(err, idempotent.ErrBeyondRetention) || errors.Is(err, idempotent.ErrInvalidEventTime)
}
