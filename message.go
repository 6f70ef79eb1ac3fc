package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Message is what the middleware needs to know of a message: its identity
// and, when the producer stamped one, its event time. Every entry point
// takes one — ProcessMessage, ProcessMessages, ProcessMessageTx,
// ProcessMessagesTx, ClaimMessage, ProcessNatural and the Wrap functions
// built on them — so event times, partitioned mode, batches and
// caller-owned transactions combine freely.
type Message struct {
	// Key is the message's stable, producer-assigned identity — an event id
	// or a natural key such as "order-completed:9912", never a broker's
	// delivery tag or a message id the broker reassigns on republish. It
	// must be non-empty valid UTF-8 without NUL bytes, at most the
	// dialect's limit in bytes.
	Key string

	// EventTime is when the producer says the event happened, stable across
	// redeliveries and replays (set once by the producer, never by the
	// broker or the consumer). The zero value means unknown.
	//
	// When it is known, the retention fence applies: a message whose event
	// time is older than the retention window is refused with
	// ErrBeyondRetention, and one later than the clock plus the clock-skew
	// margin with ErrInvalidEventTime, before any transaction. When it is
	// unknown the fence cannot apply. In partitioned mode
	// (WithDailyPartitions) it chooses the claim's partition and is
	// required: a zero EventTime is refused with ErrInvalidEventTime.
	EventTime time.Time

	// OrderKey names the entity whose messages must apply in the
	// producer's order (an account, an order), and OrderSeq is the
	// producer's sequence number of this message for that entity, from 1
	// with no gaps. Both or neither: "" and 0 mean the message is not
	// ordered. They need a Middleware created WithOrdering, which applies
	// the message only after its predecessor (see docs/ordering.md). The
	// key must be non-empty valid UTF-8 without NUL bytes, at most the
	// dialect's dialect.Orderer limit in bytes.
	OrderKey string
	OrderSeq int64

	// Payload and Headers are the message as the transport delivered it.
	// They are read only for an ordered message that arrives before its
	// predecessor: it is parked with them, and applied later by
	// Ordering.Release from them. The adapters keep the body and the
	// headers the library defines (the ordering key and sequence, the event
	// time); the Redis Streams and Kafka adapters keep every field or
	// header (redisstream.ParkedDelivery, kafka.ParkedRecord rebuild the
	// delivery). Elsewhere a Release that needs another header (a message
	// type, a tenant) must find it in the body, or the producer must carry
	// it there.
	Payload []byte
	Headers map[string]string
}

// checkMessage decides, before any transaction, whether msg may be claimed:
// its key is valid and its event time, if any, passes the retention fence.
func (m *Middleware) checkMessage(msg Message) error {
	if err := validateKey(msg.Key, m.maxKey); err != nil {
		return err
	}
	if err := m.checkOrder(msg); err != nil {
		return err
	}
	return m.checkEvent(msg.Key, msg.EventTime)
}

// CheckMessage reports whether ProcessMessage would refuse msg before
// sending anything, and why: an invalid key (ErrInvalidKey: empty, not
// UTF-8, a NUL byte, longer than the dialect allows), an event time older
// than the retention window (ErrBeyondRetention), later than the clock plus
// the clock-skew margin or, in partitioned mode, missing
// (ErrInvalidEventTime). It sends nothing. Adapters use it to set a message
// aside (to a dead-letter queue) before they open a transaction for it.
func (m *Middleware) CheckMessage(msg Message) error {
	return m.checkMessage(msg)
}

// ProcessMessage applies fn's effect for msg exactly once for this
// consumer.
//
// It begins a transaction, inserts the claim (consumer, msg.Key), and, only
// if the claim is new, runs fn in the same transaction and commits both
// together: the result is Applied. If the claim exists, fn does not run and
// the result is Duplicate. A concurrent delivery of the same key waits for
// the first to finish; if that one rolls back, the waiting one applies.
//
// When msg carries its event time, the retention fence applies before any
// transaction: an event time older than the retention window fails with an
// error matching ErrBeyondRetention, one later than the clock plus the
// clock-skew margin with ErrInvalidEventTime; nothing is written and fn
// does not run. In partitioned mode the event time is required and chooses
// the claim's partition; a day inside the window whose partition does not
// exist yet fails with ErrNoPartition, which is transient.
//
// An error from fn rolls back claim and effect together and is returned
// wrapped. Serialization failures, deadlocks and lost connections of the
// claim's own transaction — even during COMMIT, where the outcome is
// unknown — are retried from the start under the retry policy: if a lost
// COMMIT did land, the retry finds the claim and returns Duplicate. An
// error fn met elsewhere (another database, its own network call, its own
// deadline) is returned at once, without a retry; the package
// documentation has the table. A panic in fn rolls back and re-panics.
//
// fn must do all its work through tx, with ctx; see GuardConnector for how
// a mistake is caught. fn must not begin a transaction of its own with ctx —
// any entry point called with it fails with ErrAutocommit and the delivery
// rolls back. Ack the message only after ProcessMessage returns without an
// error (Applied and Duplicate alike).
func (m *Middleware) ProcessMessage(ctx context.Context, msg Message, fn TxFunc) (Outcome, error) {
	return m.processMessage(ctx, &m.run, msg, fn)
}

// processMessage is the one single-message path: every entry point that
// processes one message with a claim (ProcessMessage, ProcessMessageTx,
// WrapMessage, WrapMessageTx) ends here. r is the Middleware's runner, or a
// copy with a caller's begin function.
func (m *Middleware) processMessage(ctx context.Context, r *runner, msg Message, fn TxFunc) (Outcome, error) {
	return m.observe(ctx, msg.Key, func(ctx context.Context) (Outcome, int, error) { return m.process(ctx, r, msg, fn) })
}

// process checks msg, then claims it and runs fn under r's retries.
func (m *Middleware) process(ctx context.Context, r *runner, msg Message, fn TxFunc) (Outcome, int, error) {
	if fn == nil {
		return 0, 0, errors.New("idempotent: ProcessMessage: nil function")
	}
	if err := m.checkMessage(msg); err != nil {
		return 0, 0, err
	}
	scope := m.preCheckScope(ctx)
	if m.seenBefore(ctx, scope, msg.Key) {
		return Duplicate, 0, nil
	}
	m.refreshLease(ctx, msg.EventTime)
	if m.co != nil && r == &m.run {
		return m.co.process(ctx, msg, fn, scope)
	}
	return m.claimAndRun(ctx, r, msg, fn, scope)
}

// claimAndRun claims msg in a transaction of its own and runs fn there
// under r's retries: the single-message path after its checks, and what a
// coalesced call that finds itself alone runs. scope is the pre-check's
// (preCheckScope), in which a committed claim is recorded.
func (m *Middleware) claimAndRun(ctx context.Context, r *runner, msg Message, fn TxFunc, scope SeenScope) (Outcome, int, error) {
	key := msg.Key
	var outcome Outcome
	var released []ParkedMessage
	attempts, err := r.run(ctx, key, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		released = nil
		var (
			claimed bool
			adv     *advanced
			err     error
		)
		if m.ord != nil && m.claimsWithAdvance(msg) {
			claimed, adv, err = m.claimAdvance(ctx, tx, st, msg)
		} else {
			claimed, err = m.claimKey(ctx, tx, st, key, msg.EventTime)
		}
		if err != nil {
			return err
		}
		if !claimed {
			outcome = Duplicate
			st.skipCommit = true
			return nil
		}
		if msg.OrderKey != "" {
			outcome, released, err = m.ordered(ctx, tx, st, msg, fn, adv)
			return err
		}
		outcome = Applied
		st.inHandler = true
		return fn(ctx, tx)
	})
	if err != nil {
		err = m.reclassify(ctx, err)
		return 0, attempts, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
	}
	if outcome != Parked {
		// A parked message is not applied yet: the gap policy may still
		// dead-letter it and delete its claim, and its replay must then
		// reach the claim table.
		m.recordSeen(ctx, scope, key)
	}
	m.observeReleased(ctx, released)
	return outcome, attempts, nil
}

// ClaimMessage inserts the claim for msg in a transaction the caller owns,
// and reports whether it was new. When it was, the caller applies the effect
// in tx and commits; when not, the message is a duplicate. ClaimMessage
// neither commits nor retries: the caller does both. The lock timeout, if
// set, applies to tx from here on.
//
// The retention fence applies as for ProcessMessage, before any statement:
// ErrBeyondRetention for an event time older than the window,
// ErrInvalidEventTime for one in the future or, in partitioned mode, for a
// zero one. In partitioned mode the claim goes into the event day's
// partition; when the day has no partition yet the statement fails inside
// tx, which the caller must then roll back, and the error matches
// ErrNoPartition.
func (m *Middleware) ClaimMessage(ctx context.Context, tx *sql.Tx, msg Message) (claimed bool, err error) {
	if tx == nil {
		return false, errors.New("idempotent: ClaimMessage: nil transaction")
	}
	if err := m.checkMessage(msg); err != nil {
		return false, err
	}
	if err := refuseOrdered(msg, "ClaimMessage"); err != nil {
		return false, err
	}
	claimed, err = m.claimKey(ctx, tx, nil, msg.Key, msg.EventTime)
	if err != nil {
		return false, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, msg.Key, err)
	}
	return claimed, nil
}

// WrapMessage turns a handler of decoded messages into a function that
// processes each message exactly once with ProcessMessage. msg returns the
// message's Message: its stable, producer-assigned key and, when the
// producer stamped one, its event time (required in partitioned mode). If
// msg fails, the returned function returns an error matching ErrInvalidKey
// without opening a transaction.
func WrapMessage[M any](m *Middleware, msg func(M) (Message, error), h Handler[M]) func(ctx context.Context, msg M) (Outcome, error) {
	return func(ctx context.Context, v M) (Outcome, error) {
		if msg == nil || h == nil {
			return 0, errors.New("idempotent: WrapMessage: nil message function or handler")
		}
		mm, err := messageOf(ctx, m, msg, v)
		if err != nil {
			return 0, err
		}
		return m.processMessage(ctx, &m.run, mm, func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, v) })
	}
}

// messageOf is the one reading of a message's Message by the
// single-message wrappers (WrapMessage, WrapMessageTx): a failure of msg is
// told to the observer and returned matching ErrInvalidKey.
func messageOf[M any](ctx context.Context, m *Middleware, msg func(M) (Message, error), v M) (Message, error) {
	mm, err := msg(v)
	if err != nil {
		return Message{}, m.keyFailed(ctx, err)
	}
	return mm, nil
}
