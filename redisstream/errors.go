package redisstream

import (
	"errors"
	"fmt"

	"github.com/txclaim/idempotent/adapter"
)

// Errors of this package; match them with errors.Is. The errors of an
// entry (poison, no key, undecodable payload) are package adapter's:
// adapter.ErrPoison, adapter.ErrNoKey, adapter.ErrUndecodable.
var (
	// ErrMaxDeliveries reports an entry the consumer group delivered more
	// times than the bound of WithMaxDeliveries. It matches
	// adapter.ErrPoison: the entry is dead-lettered.
	ErrMaxDeliveries = fmt.Errorf("%w: delivered too many times", adapter.ErrPoison)

	// ErrClientClosed is returned by Consumer.Run when the Redis client
	// under it was closed. What it had read and not acknowledged stays
	// pending, and is re-claimed by another consumer of the group after
	// the claim idle bound (WithClaimIdle).
	ErrClientClosed = errors.New("redisstream: client closed")

	// ErrNoGroup is returned by Consumer.Run when the consumer group, or
	// its stream, was deleted while Run read it (Redis's NOGROUP error).
	ErrNoGroup = errors.New("redisstream: consumer group or stream is gone")
)
