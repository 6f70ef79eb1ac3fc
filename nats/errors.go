package nats

import "errors"

// Errors Consumer.Run returns; match them with errors.Is. The errors of a
// message (poison, no key, undecodable data) are package adapter's:
// adapter.ErrPoison, adapter.ErrNoKey, adapter.ErrUndecodable.
var (
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
