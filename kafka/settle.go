package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// producerEventTime reports whether the configured event-time source is a
// producer's (the header, the default, or WithEventTime), for
// adapter.CheckEventTimeSource. The record timestamp (WithTransportEventTime)
// is not: a re-send gets a new one, which on a day-partitioned table is
// another day's partition, so every adapter refuses it there.
func (c config) producerEventTime() bool {
	return c.eventTime != eventTimeNone && c.eventTime != eventTimeTransport
}

// eventTime returns r's event time from the configured source: the zero
// time when it has none.
func (c *Consumer) eventTime(r *kgo.Record) (time.Time, error) {
	switch c.cfg.eventTime {
	case eventTimeNone:
		return time.Time{}, nil
	case eventTimeTransport:
		return r.Timestamp, nil
	case eventTimeFunc:
		at, err := c.cfg.eventTimeFn(r)
		if err != nil {
			return time.Time{}, fmt.Errorf("kafka: event time function: %w", err)
		}
		return at, nil
	}
	for _, h := range r.Headers {
		if h.Key == adapter.EventTimeHeader {
			return adapter.ParseEventTime(string(h.Value)) // the first, as Header reads keys
		}
	}
	return time.Time{}, nil
}

// message returns r's message, key and event time, or the error that makes
// it unclaimable (settle says what to do with it); msg holds what could be
// read either way.
func (c *Consumer) message(r *kgo.Record) (msg idempotent.Message, err error) {
	key, err := c.recordKey(r)
	if err != nil {
		return idempotent.Message{}, err
	}
	at, err := c.eventTime(r)
	if err != nil {
		return idempotent.Message{Key: key}, fmt.Errorf("kafka: %s: %w", deadLetterKey(r), err)
	}
	return idempotent.Message{Key: key, EventTime: at}, nil
}

// settle decides what to do with a record (or, msg zero, a batch) whose
// attempt failed with err: poison when the handler marked it so (IsPoison,
// WithPoison), otherwise what adapter.Rule.Settle says. Errors that stop
// the partition or fence it are not settled: the callers handle them
// first.
func (c *Consumer) settle(msg idempotent.Message, err error, attempt int) adapter.Decision {
	if IsPoison(err) {
		return adapter.Decision{Action: adapter.DeadLetter, Err: err}
	}
	for _, p := range c.cfg.poison {
		if p(err) {
			return adapter.Decision{Action: adapter.DeadLetter, Err: err}
		}
	}
	return c.rule.Settle(msg, err, attempt)
}

// requeueError is a failed attempt that waits delay before the next.
type requeueError struct {
	err   error
	delay time.Duration
}

func (e *requeueError) Error() string { return e.err.Error() }
func (e *requeueError) Unwrap() error { return e.err }

// recordKey returns r's message key, or a poison error.
func (c *Consumer) recordKey(r *kgo.Record) (string, error) {
	k, err := c.key(r)
	if err != nil {
		if errors.Is(err, idempotent.ErrInvalidKey) || errors.Is(err, ErrPoison) {
			return "", err
		}
		return "", fmt.Errorf("%w: key function: %w", idempotent.ErrInvalidKey, err)
	}
	return k, nil
}
