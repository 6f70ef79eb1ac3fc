package kafka

import (
	"errors"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// requeueError is a failed attempt that the settle rule requeues: the
// partition waits delay, the rule's, before the next attempt.
type requeueError struct {
	err   error
	delay time.Duration
}

func (e *requeueError) Error() string { return e.err.Error() }
func (e *requeueError) Unwrap() error { return e.err }

// errAttempt stands for a transaction of the Consumer's own that failed —
// a dead letter's, say, or a batch's whose error names no record — when
// the rule's backoff must be read for it.
var errAttempt = errors.New("kafka: the attempt's transaction failed")

// requeue returns err as a *requeueError with the settle rule's delay for
// attempt (from 1): err itself if it is one; the rule's backoff for an
// error the rule would not requeue (the failure of a transaction that was
// to dead-letter a record must be retried all the same).
func (c *Consumer) requeue(msg idempotent.Message, err error, attempt int) *requeueError {
	var rq *requeueError
	if errors.As(err, &rq) {
		return rq
	}
	d := c.rule.Settle(msg, err, attempt)
	if d.Action != adapter.Requeue {
		d = c.rule.Settle(idempotent.Message{}, errAttempt, attempt)
	}
	return &requeueError{err: err, delay: d.Delay}
}
