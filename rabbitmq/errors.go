package rabbitmq

import "errors"

// Errors of Consumer.Run; match them with errors.Is. What a delivery is
// settled with — poison, a missing key or event time — is adapter's:
// adapter.ErrPoison, adapter.ErrNoKey, adapter.ErrNoEventTime,
// adapter.ErrUndecodable.
var (
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
