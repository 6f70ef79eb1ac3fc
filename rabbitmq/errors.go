package rabbitmq

import (
	"errors"
	"fmt"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
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

// IsPoison reports whether a Consumer without WithPoison predicates
// dead-letters a delivery whose Handler returned err: err matches ErrPoison
// (which includes ErrUndecodable and errors marked with Poison), or the one
// settle rule, adapter.Rule.Settle, says poison — idempotent.ErrInvalidKey
// (which includes ErrNoKey), idempotent.ErrBeyondRetention (a message older
// than the retention window, whose claim may already be gone),
// adapter.ErrBadEventTime, or idempotent.ErrInvalidEventTime for a message
// with no event time or one dated beyond adapter.DefaultFutureBound ahead
// of the clock.
//
// What is not yet possible is not poison, and is requeued: a message dated
// ahead of the clock within the bound, idempotent.ErrNoPartition (the event
// day's partition is not created yet), idempotent.ErrClaimBusy and
// idempotent.ErrRetriesExhausted. The clock is the Middleware's for an error
// of a Handler built by Process or Decode.
func IsPoison(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrPoison) {
		return true
	}
	rule, msg := settleRule(err, idempotent.RetryPolicy{})
	return rule.Settle(msg, err, 1).Action == adapter.DeadLetter
}
