package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/parkrow"
)

// Ordered per key.
//
// A message that carries an ordering key (Message.OrderKey: the entity, an
// account or an order) and a sequence number (Message.OrderSeq: the
// producer's version of that entity, from 1) is applied only in sequence
// order, checked in the claim's database, in the effect's transaction:
//
//   - the sequence table holds, per (consumer, ordering key), the last
//     sequence applied; the transaction locks that row after the claim;
//   - the next sequence (last + 1) runs its handler, then every parked
//     successor that has become next, in order, through Ordering.Release,
//     and sets the row to the last one applied — all in the same
//     transaction, committed with the claim;
//   - a sequence at or below the row is Duplicate, even when its claim was
//     cleaned up long ago; one an operator skipped (SkipGap) is refused
//     with ErrSkippedSequence;
//   - a sequence further ahead is parked: its key, payload, headers and
//     event time go into the parking table, in the transaction that
//     inserts its claim, and the outcome is Parked: the caller acks it. A
//     redelivery of a parked message finds its claim and is Duplicate.
//
// Why the parked successors apply in the predecessor's transaction, not in
// transactions that follow: the predecessor's delivery is acked only after
// that transaction commits, so a crash anywhere leaves either everything
// (predecessor, successors, the row) committed or nothing, and the broker
// redelivers the predecessor, which releases them again. No parked message
// can be left next-but-waiting by a crash, and no sweeper is needed for
// correctness. The price: one delivery's transaction grows with the chain
// it releases, and a successor whose Release fails fails its predecessor's
// delivery too (the entity cannot progress past it anyway; the error names
// it). CheckGaps releases what an operator's skip made next.

// Parked is the outcome of a message that arrived before its predecessor:
// it is stored in the parking table, with its claim, and applies when its
// predecessor does. Ack it.
const Parked Outcome = Duplicate + 1

// ErrInvalidOrder reports a message whose ordering fields cannot be used:
// an ordering key without a sequence or the other way round, a sequence
// below 1, an ordering key that is empty, not UTF-8, has a NUL byte or is
// longer than the dialect's limit, or ordering fields given to a
// Middleware created without WithOrdering or to an entry point that does
// not keep order. Nothing was written. The message is poison: redelivering
// it fails the same way.
var ErrInvalidOrder = errors.New("idempotent: invalid message order")

// ErrSkippedSequence reports a message whose sequence an operator skipped
// (SkipGap): it arrived after its successors were applied without it, and
// is not applied. Nothing was written.
var ErrSkippedSequence = errors.New("idempotent: sequence was skipped")

// GapPolicy is what CheckGaps does with the parked messages of a gap open
// longer than Ordering.GapTimeout.
type GapPolicy int

const (
	// GapHold keeps them parked and reports the gap (the default): the
	// missing message, or an operator's SkipGap, releases them.
	GapHold GapPolicy = iota
	// GapDeadLetter hands each of them to Ordering.DeadLetter, then deletes
	// it from the parking table together with its claim, so that a replay
	// from the dead-letter queue is a new delivery.
	GapDeadLetter
)

// String returns "hold" or "dead-letter".
func (p GapPolicy) String() string {
	switch p {
	case GapHold:
		return "hold"
	case GapDeadLetter:
		return "dead-letter"
	}
	return fmt.Sprintf("GapPolicy(%d)", int(p))
}

// DefaultGapTimeout is Ordering.GapTimeout when zero.
const DefaultGapTimeout = 15 * time.Minute

// MaxSkip is the most sequence numbers one SkipGap may skip.
const MaxSkip = 10000

// Ordering configures WithOrdering.
type Ordering struct {
	// Release applies a parked message's effect, in the transaction of
	// the delivery (or the SkipGap, or the CheckGaps) that made it next,
	// after its predecessor's effect. It gets the message as it was
	// parked: key, event time, ordering key and sequence, payload and
	// headers. Like a handler, it must do all its work through tx.
	// Required.
	Release func(ctx context.Context, tx *sql.Tx, p ParkedMessage) error
	// GapTimeout is how long a parked message may wait for its
	// predecessor before CheckGaps reports the gap and applies Policy.
	// Default is DefaultGapTimeout.
	GapTimeout time.Duration
	// Policy is what CheckGaps does with a gap older than GapTimeout.
	// Default is GapHold.
	Policy GapPolicy
	// DeadLetter receives each parked message of an expired gap under
	// GapDeadLetter; the message leaves the parking table only when it
	// returns nil. Required with GapDeadLetter, refused otherwise.
	DeadLetter func(ctx context.Context, p ParkedMessage) error
}

// ParkedMessage is a message kept in the parking table.
type ParkedMessage struct {
	// Message is the message as it was parked, with its Payload and
	// Headers (from the adapters: the library's own headers, or every
	// header where the adapter keeps them, as Kafka's and Redis Streams'
	// do; see Message.Headers).
	Message
	// ParkedAt is when it was parked, by the Middleware's clock.
	ParkedAt time.Time
}

// WithOrdering makes the Middleware keep, per ordering key, the producer's
// sequence order of the messages that carry one (Message.OrderKey and
// Message.OrderSeq; messages without them are processed as before). See
// docs/ordering.md. EnsureSchema then also creates the sequence and
// parking tables; New refuses it on a dialect that is not a
// dialect.Orderer. ProcessMessages and the batch wrappers keep the order
// within and across batches (see ProcessMessages); under WithCoalescing
// ordered messages join groups, at most one per ordering key in a group
// (a second waits for the next group), and ClaimMessage refuses them with
// ErrInvalidOrder. Default is off.
func WithOrdering(o Ordering) Option {
	return optionFunc(func(c *config) error {
		switch {
		case o.Release == nil:
			return errors.New("idempotent: WithOrdering: nil Release")
		case o.GapTimeout < 0:
			return fmt.Errorf("idempotent: WithOrdering: GapTimeout %v is negative", o.GapTimeout)
		case o.Policy != GapHold && o.Policy != GapDeadLetter:
			return fmt.Errorf("idempotent: WithOrdering: unknown %v", o.Policy)
		case o.Policy == GapDeadLetter && o.DeadLetter == nil:
			return errors.New("idempotent: WithOrdering: GapDeadLetter needs a DeadLetter function")
		case o.Policy != GapDeadLetter && o.DeadLetter != nil:
			return fmt.Errorf("idempotent: WithOrdering: a DeadLetter function is only called under GapDeadLetter, not %v", o.Policy)
		}
		if o.GapTimeout == 0 {
			o.GapTimeout = DefaultGapTimeout
		}
		c.ordering = &o
		return nil
	})
}

// orderer is a Middleware's ordering: its configuration and statements.
type orderer struct {
	Ordering
	d                                     dialect.Orderer
	maxKey                                int
	advanceSQL, markSQL, claimAdvanceSQL  string
	rowSQL, lockSQL, bumpSQL, parkSQL     string
	skipSQL, parkedSQL, unparkSQL         string
	waitingSQL, parkedRowsSQL, unclaimSQL string
	seqTable, parkTable                   dialect.Table
	schema                                []string
}

func newOrderer(d dialect.Dialect, t dialect.Table, o *Ordering) (*orderer, error) {
	od, ok := d.(dialect.Orderer)
	if !ok {
		return nil, fmt.Errorf("idempotent: WithOrdering: the %s dialect cannot keep messages in order (it is no dialect.Orderer)", d.Name())
	}
	seq, park := od.OrderTables(t)
	return &orderer{
		Ordering: *o, d: od, maxKey: od.MaxOrderKeyBytes(),
		advanceSQL: od.OrderAdvanceSQL(t), markSQL: od.OrderMarkSQL(t), claimAdvanceSQL: od.OrderClaimAdvanceSQL(t),
		rowSQL: od.OrderRowSQL(t), lockSQL: od.OrderLockSQL(t), bumpSQL: od.OrderBumpSQL(t),
		parkSQL: od.ParkSQL(t), skipSQL: od.SkipSQL(t), parkedSQL: od.ParkedSQL(t), unparkSQL: od.UnparkSQL(t),
		waitingSQL: od.WaitingSQL(t), parkedRowsSQL: od.ParkedRowsSQL(t), unclaimSQL: od.UnclaimSQL(t),
		seqTable: seq, parkTable: park, schema: od.OrderSchemaSQL(t),
	}, nil
}

// checkOrder validates msg's ordering fields (see ErrInvalidOrder).
func (m *Middleware) checkOrder(msg Message) error {
	if msg.OrderKey == "" && msg.OrderSeq == 0 {
		return nil
	}
	if m.ord == nil {
		return fmt.Errorf("%w: consumer %q, key %q: the message has an ordering key or sequence, but the Middleware was not created WithOrdering", ErrInvalidOrder, m.consumer, msg.Key)
	}
	return validateOrder(msg.OrderKey, msg.OrderSeq, m.ord.maxKey)
}

// validateOrder checks an ordering key and sequence.
func validateOrder(key string, seq int64, max int) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: sequence %d without an ordering key", ErrInvalidOrder, seq)
	case seq == 0:
		return fmt.Errorf("%w: ordering key %q without a sequence (sequences start at 1)", ErrInvalidOrder, truncate(key, 80))
	case seq < 0:
		return fmt.Errorf("%w: ordering key %q: sequence %d is below 1", ErrInvalidOrder, truncate(key, 80), seq)
	case len(key) > max:
		return fmt.Errorf("%w: ordering key of %d bytes, the limit is %d", ErrInvalidOrder, len(key), max)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: ordering key %q is not valid UTF-8", ErrInvalidOrder, key)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: ordering key %q has a NUL byte at %d", ErrInvalidOrder, key, i)
		}
	}
	return nil
}

// refuseOrdered is the check of the entry points that do not keep order.
func refuseOrdered(msg Message, entry string) error {
	if msg.OrderKey == "" && msg.OrderSeq == 0 {
		return nil
	}
	return fmt.Errorf("%w: key %q: %s does not keep order; process ordered messages with ProcessMessage (or WrapMessage)", ErrInvalidOrder, msg.Key, entry)
}

// lock makes sure the entity's sequence row exists and locks it, returning
// its last sequence and parked_max.
func (o *orderer) lock(ctx context.Context, tx *sql.Tx, consumer, key string) (last, parkedMax int64, err error) {
	if _, err := tx.ExecContext(ctx, o.rowSQL, consumer, key); err != nil {
		return 0, 0, fmt.Errorf("idempotent: ordering key %q: insert sequence row: %w", key, err)
	}
	return o.read(ctx, tx, consumer, key)
}

// read locks the entity's sequence row, which exists, and returns its last
// sequence and parked_max.
func (o *orderer) read(ctx context.Context, tx *sql.Tx, consumer, key string) (last, parkedMax int64, err error) {
	if err := tx.QueryRowContext(ctx, o.lockSQL, consumer, key).Scan(&last, &parkedMax); err != nil {
		return 0, 0, fmt.Errorf("idempotent: ordering key %q: lock sequence row: %w", key, err)
	}
	return last, parkedMax, nil
}

// advanced is what OrderAdvanceSQL yielded: whether a row, and its
// last_seq and parked_max.
type advanced struct {
	row      bool
	now, max int64
}

// advance decides an ordered message of sequence seq under the entity's
// lock (see docs/ordering.md, "Statement by statement"): it returns the
// last sequence applied before it and parked_max. When the dialect has
// OrderAdvanceSQL, one statement creates or locks the row, moves last_seq
// to seq when seq is next (moved) and raises parked_max when seq is
// ahead — it ran already, with the claim, when a is not nil; otherwise
// the row is locked and read, and the caller bumps or marks it.
func (o *orderer) advance(ctx context.Context, tx *sql.Tx, consumer, key string, seq int64, a *advanced) (last, parkedMax int64, moved bool, err error) {
	if o.advanceSQL == "" {
		last, parkedMax, err = o.lock(ctx, tx, consumer, key)
		return last, parkedMax, false, err
	}
	if a == nil {
		a = &advanced{row: true}
		err = tx.QueryRowContext(ctx, o.advanceSQL, consumer, key, seq).Scan(&a.now, &a.max)
		if errors.Is(err, sql.ErrNoRows) {
			a.row, err = false, nil
		}
		if err != nil {
			return 0, 0, false, fmt.Errorf("idempotent: ordering key %q: advance sequence row: %w", key, err)
		}
	}
	switch {
	case !a.row:
		// At or below last_seq: nothing changed, the row is locked.
		last, parkedMax, err = o.read(ctx, tx, consumer, key)
		return last, parkedMax, false, err
	case a.now == seq:
		return seq - 1, a.max, true, nil
	}
	return a.now, a.max, false, nil
}

// claimAdvance claims msg and advances its entity's row in one statement
// (OrderClaimAdvanceSQL), as claimKey claims: under the lock timeout, the
// strict guard's first reading taken after it.
func (m *Middleware) claimAdvance(ctx context.Context, tx *sql.Tx, st *attemptState, msg Message) (bool, *advanced, error) {
	a := &advanced{}
	claimed, err := m.claimWith(ctx, tx, st, func() (bool, error) {
		var n int64
		var now, max sql.NullInt64
		if err := tx.QueryRowContext(ctx, m.ord.claimAdvanceSQL, m.consumerArg, msg.Key, msg.OrderKey, msg.OrderSeq).Scan(&n, &now, &max); err != nil {
			return false, m.claimError(err)
		}
		a.row, a.now, a.max = now.Valid, now.Int64, max.Int64
		return n == 1, nil
	})
	return claimed, a, err
}

// claimsWithAdvance reports whether msg's claim and advance go in one
// statement: the dialect has it, and the claim is the plain one (no
// partition, no event time for the horizon's fence).
func (m *Middleware) claimsWithAdvance(msg Message) bool {
	return msg.OrderKey != "" && m.ord.claimAdvanceSQL != "" && m.ret.part == nil && msg.EventTime.IsZero()
}

// lookup reads the parking table's row of one sequence: state "" when
// there is none.
func (o *orderer) lookup(ctx context.Context, tx *sql.Tx, consumer, key string, seq int64) (state string, p ParkedMessage, err error) {
	var headers string
	var at int64
	err = tx.QueryRowContext(ctx, o.parkedSQL, consumer, key, seq).Scan(&state, &p.Key, &p.Payload, &headers, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return "", p, nil
	}
	if err != nil {
		return "", p, fmt.Errorf("idempotent: ordering key %q, sequence %d: read parking table: %w", key, seq, err)
	}
	p.OrderKey, p.OrderSeq = key, seq
	if p.EventTime, p.Headers, err = parkrow.Decode(at, headers); err != nil {
		return "", p, fmt.Errorf("idempotent: ordering key %q, sequence %d: %w", key, seq, err)
	}
	return state, p, nil
}

// ordered decides, in tx, after msg's claim was inserted, what msg's
// sequence means (see the top of this file), and runs fn or parks it. It
// reports the outcome and the parked messages it released. a is the
// advance that ran with the claim (claimAdvance), or nil.
func (m *Middleware) ordered(ctx context.Context, tx *sql.Tx, st *attemptState, msg Message, fn TxFunc, a *advanced) (Outcome, []ParkedMessage, error) {
	outcome, parkedMax, err := m.orderBefore(ctx, tx, st, m.ord, msg, a)
	if err != nil || outcome != Applied {
		return outcome, nil, err
	}
	st.inHandler = true
	if err := fn(ctx, tx); err != nil {
		return 0, nil, err
	}
	st.inHandler = false
	released, err := m.release(ctx, tx, st, m.ord, msg.OrderKey, msg.OrderSeq, parkedMax, true)
	return Applied, released, err
}

// orderBefore is the step of ordered before the handler: under the
// entity's lock it decides msg's sequence. Duplicate (the transaction has
// nothing to commit: st.skipCommit) and Parked end msg's delivery; Applied
// says that msg is next and its sequence already moved: the caller runs
// the handler, then release from msg's sequence up to parkedMax. o is
// m.ord, or a coalesced group's (see coalescer.ord).
func (m *Middleware) orderBefore(ctx context.Context, tx *sql.Tx, st *attemptState, o *orderer, msg Message, a *advanced) (outcome Outcome, parkedMax int64, err error) {
	seq := msg.OrderSeq
	last, parkedMax, moved, err := o.advance(ctx, tx, m.consumer, msg.OrderKey, seq, a)
	if err != nil {
		return 0, 0, err
	}
	switch {
	case seq <= last:
		state, _, err := o.lookup(ctx, tx, m.consumer, msg.OrderKey, seq)
		if err != nil {
			return 0, 0, err
		}
		if state == "S" {
			return 0, 0, fmt.Errorf("%w: ordering key %q, sequence %d was skipped by an operator and its successors applied without it (last applied %d); it is not applied",
				ErrSkippedSequence, msg.OrderKey, seq, last)
		}
		st.skipCommit = true
		return Duplicate, 0, nil
	case seq > last+1:
		parked, err := o.park(ctx, tx, m.consumer, msg, m.ret.clock())
		if err != nil {
			return 0, 0, err
		}
		if !parked {
			// Another message with the same sequence waits already.
			st.skipCommit = true
			return Duplicate, 0, nil
		}
		return Parked, 0, nil
	}
	// The sequence moves before the effect runs: a handler that commits
	// the transaction itself (a mistake the guard reports) then commits
	// the sequence with its claim, as a plain handler commits its claim
	// with its effect, and no later release can apply it a second time.
	if !moved {
		if err := o.bump(ctx, tx, m.consumer, msg.OrderKey, seq); err != nil {
			return 0, 0, err
		}
	}
	return Applied, parkedMax, nil
}

// park stores msg in the parking table and raises the entity's parked_max,
// under the entity's lock; parked is false when a message of the same
// sequence is parked already.
func (o *orderer) park(ctx context.Context, tx *sql.Tx, consumer string, msg Message, now time.Time) (parked bool, err error) {
	key, seq := msg.OrderKey, msg.OrderSeq
	if o.advanceSQL == "" {
		// The park's insert cannot tell a duplicate here (MySQL's
		// affected rows depend on clientFoundRows): look first, and
		// raise parked_max, which advance did not.
		state, _, err := o.lookup(ctx, tx, consumer, key, seq)
		if err != nil || state != "" {
			return false, err
		}
		if _, err := tx.ExecContext(ctx, o.markSQL, seq, seq, consumer, key); err != nil {
			return false, fmt.Errorf("idempotent: ordering key %q, sequence %d: mark parked: %w", key, seq, err)
		}
	}
	res, err := o.insertParked(ctx, tx, consumer, msg, now)
	if err != nil {
		return false, err
	}
	if o.advanceSQL == "" {
		return true, nil
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idempotent: ordering key %q, sequence %d: park: %w", key, seq, err)
	}
	return n == 1, nil
}

// parkLocked parks msg for a caller that locked the entity's row with
// lock, not advance, and found no parking row for its sequence (a batch):
// it raises parked_max itself, as advance does for a single message, so
// that release looks for msg.
func (o *orderer) parkLocked(ctx context.Context, tx *sql.Tx, consumer string, msg Message, now time.Time) error {
	if _, err := tx.ExecContext(ctx, o.markSQL, msg.OrderSeq, msg.OrderSeq, consumer, msg.OrderKey); err != nil {
		return fmt.Errorf("idempotent: ordering key %q, sequence %d: mark parked: %w", msg.OrderKey, msg.OrderSeq, err)
	}
	_, err := o.insertParked(ctx, tx, consumer, msg, now)
	return err
}

// insertParked inserts msg into the parking table, with its payload, event
// time and headers.
func (o *orderer) insertParked(ctx context.Context, tx *sql.Tx, consumer string, msg Message, now time.Time) (sql.Result, error) {
	at, headers, err := parkrow.Encode(msg.EventTime, msg.Headers)
	if err != nil {
		return nil, fmt.Errorf("idempotent: %w", err)
	}
	payload := msg.Payload
	if payload == nil {
		payload = []byte{}
	}
	res, err := tx.ExecContext(ctx, o.parkSQL, consumer, msg.OrderKey, msg.OrderSeq, msg.Key, payload, headers, at, now.UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("idempotent: ordering key %q, sequence %d: park: %w", msg.OrderKey, msg.OrderSeq, err)
	}
	return res, nil
}

// bump sets key's last applied sequence to seq.
func (o *orderer) bump(ctx context.Context, tx *sql.Tx, consumer, key string, seq int64) error {
	if _, err := tx.ExecContext(ctx, o.bumpSQL, seq, consumer, key); err != nil {
		return fmt.Errorf("idempotent: ordering key %q: set last sequence %d: %w", key, seq, err)
	}
	return nil
}

// release applies, in tx, every parked message of key that follows last
// without a gap, through Ordering.Release, and sets the sequence row to
// the last one applied (to last first, unless bumped says it is there
// already). The row must be locked by tx; parkedMax is its parked_max:
// no message above it can be parked, so release does not look past it.
// Each parked message leaves the parking table and becomes the last
// applied before its Release runs, for the reason ordered bumps before its
// handler. o is m.ord, or a coalesced group's (see coalescer.ord).
func (m *Middleware) release(ctx context.Context, tx *sql.Tx, st *attemptState, o *orderer, key string, last, parkedMax int64, bumped bool) ([]ParkedMessage, error) {
	if !bumped {
		if err := o.bump(ctx, tx, m.consumer, key, last); err != nil {
			return nil, err
		}
	}
	var released []ParkedMessage
	for last < parkedMax {
		state, p, err := o.lookup(ctx, tx, m.consumer, key, last+1)
		if err != nil {
			return nil, err
		}
		if state != "P" {
			break
		}
		if _, err := tx.ExecContext(ctx, o.unparkSQL, m.consumer, key, p.OrderSeq); err != nil {
			return nil, fmt.Errorf("idempotent: ordering key %q, sequence %d: unpark: %w", key, p.OrderSeq, err)
		}
		if err := o.bump(ctx, tx, m.consumer, key, p.OrderSeq); err != nil {
			return nil, err
		}
		st.inHandler = true
		if err := o.Release(ctx, tx, p); err != nil {
			return nil, fmt.Errorf("idempotent: release parked message %q (ordering key %q, sequence %d): %w", p.Key, key, p.OrderSeq, err)
		}
		st.inHandler = false
		released = append(released, p)
		last++
	}
	return released, nil
}

// observeReleased tells the observer of each released message, Applied.
func (m *Middleware) observeReleased(ctx context.Context, released []ParkedMessage) {
	if m.observer == nil {
		return
	}
	for _, p := range released {
		m.observer.Outcome(ctx, Event{Consumer: m.consumer, Key: p.Key, Outcome: Applied, Attempts: 1})
	}
}

// SkipGap is the operator's answer to a gap that will never close: it
// marks every sequence of orderKey after the last applied, up to and
// including seq, as skipped, and applies the parked messages that follow
// without a gap, in one transaction. It returns how many it applied. A
// skipped message that arrives later is refused with ErrSkippedSequence.
// It fails, changing nothing, when seq is not ahead of the last applied
// sequence, when it would skip more than MaxSkip sequences, or when a
// message is parked at or below seq (it is not missing: skip only up to the
// sequence before it).
func (m *Middleware) SkipGap(ctx context.Context, orderKey string, seq int64) (int, error) {
	if m.ord == nil {
		return 0, errors.New("idempotent: SkipGap: the Middleware was not created WithOrdering")
	}
	if err := validateOrder(orderKey, seq, m.ord.maxKey); err != nil {
		return 0, fmt.Errorf("idempotent: SkipGap: %w", err)
	}
	o := m.ord
	var released []ParkedMessage
	_, err := m.run.run(ctx, orderKey, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		released = nil
		if err := m.captureTxID(ctx, tx, st); err != nil {
			return err
		}
		_, parkedMax, _, err := o.skip(ctx, tx, m.consumer, orderKey, seq, m.ret.clock())
		if err != nil {
			return err
		}
		released, err = m.release(ctx, tx, st, o, orderKey, seq, parkedMax, false)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idempotent: consumer %q: %w", m.consumer, err)
	}
	m.observeReleased(ctx, released)
	return len(released), nil
}

// skip is SkipGap's check and tombstones, in tx: it locks key's sequence
// row, refuses a skip SkipGap refuses, and marks every sequence after the
// last applied up to seq as skipped. It leaves the row's last_seq to the
// caller, and returns it as it was and the entity's parked messages.
func (o *orderer) skip(ctx context.Context, tx *sql.Tx, consumer, orderKey string, seq int64, now time.Time) (last, parkedMax int64, parked []ParkedMessage, err error) {
	last, parkedMax, err = o.lock(ctx, tx, consumer, orderKey)
	if err != nil {
		return 0, 0, nil, err
	}
	switch {
	case seq <= last:
		return 0, 0, nil, fmt.Errorf("%w: SkipGap: ordering key %q: sequence %d is not ahead of the last applied, %d", ErrInvalidOrder, orderKey, seq, last)
	case seq-last > MaxSkip:
		return 0, 0, nil, fmt.Errorf("%w: SkipGap: ordering key %q: skipping %d..%d is more than %d sequences", ErrInvalidOrder, orderKey, last+1, seq, MaxSkip)
	}
	parked, err = o.dropStale(ctx, tx, consumer, orderKey, last)
	if err != nil {
		return 0, 0, nil, err
	}
	if len(parked) > 0 && parked[0].OrderSeq <= seq {
		first := parked[0].OrderSeq
		return 0, 0, nil, fmt.Errorf("%w: SkipGap: ordering key %q: sequence %d is parked, not missing; skip at most up to %d", ErrInvalidOrder, orderKey, first, first-1)
	}
	at := now.UnixMicro()
	for s := last + 1; s <= seq; s++ {
		if _, err := tx.ExecContext(ctx, o.skipSQL, consumer, orderKey, s, at); err != nil {
			return 0, 0, nil, fmt.Errorf("idempotent: SkipGap: ordering key %q, sequence %d: %w", orderKey, s, err)
		}
	}
	return last, parkedMax, parked, nil
}

// dropStale deletes, under the entity's lock, its stale parked copies —
// parked messages at or below last, its last applied sequence — and
// returns the others, in sequence order. Only an operator's
// ClaimTable.SkipGap, which moves last_seq without releasing, leaves a
// parked message next; when the producer re-sends its sequence under
// another message key before CheckGaps releases it, that message applies
// the sequence as any in-order message does, and the parked copy is left
// below last_seq. It is deleted here, by CheckGaps, SkipGap or the gap
// policy, never on a delivery's path; its claim stays, so that its
// redelivery is Duplicate.
func (o *orderer) dropStale(ctx context.Context, tx *sql.Tx, consumer, key string, last int64) ([]ParkedMessage, error) {
	parked, err := o.parkedRows(ctx, tx, consumer, key)
	if err != nil {
		return nil, err
	}
	n := 0
	for n < len(parked) && parked[n].OrderSeq <= last {
		if _, err := tx.ExecContext(ctx, o.unparkSQL, consumer, key, parked[n].OrderSeq); err != nil {
			return nil, fmt.Errorf("idempotent: ordering key %q, sequence %d: delete the stale parked copy of a sequence applied: %w", key, parked[n].OrderSeq, err)
		}
		n++
	}
	return parked[n:], nil
}

// parkedRows reads every parked message of key, in sequence order.
func (o *orderer) parkedRows(ctx context.Context, tx *sql.Tx, consumer, key string) ([]ParkedMessage, error) {
	rows, err := tx.QueryContext(ctx, o.parkedRowsSQL, consumer, key)
	if err != nil {
		return nil, fmt.Errorf("idempotent: ordering key %q: read parking table: %w", key, err)
	}
	defer rows.Close()
	var out []ParkedMessage
	for rows.Next() {
		p := ParkedMessage{Message: Message{OrderKey: key}}
		var headers string
		var at, parked int64
		if err := rows.Scan(&p.OrderSeq, &p.Key, &p.Payload, &headers, &at, &parked); err != nil {
			return nil, fmt.Errorf("idempotent: ordering key %q: read parking table: %w", key, err)
		}
		p.ParkedAt = time.UnixMicro(parked).UTC()
		var err error
		if p.EventTime, p.Headers, err = parkrow.Decode(at, headers); err != nil {
			return nil, fmt.Errorf("idempotent: ordering key %q, sequence %d: %w", key, p.OrderSeq, err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotent: ordering key %q: read parking table: %w", key, err)
	}
	return out, nil
}

// Gap is an entity whose parked messages wait for a missing predecessor.
type Gap struct {
	// Consumer is the Middleware's consumer name.
	Consumer string
	// OrderKey is the entity's ordering key.
	OrderKey string
	// LastSeq is the last sequence applied (or skipped).
	LastSeq int64
	// NextParked is the lowest parked sequence: LastSeq+1 to NextParked-1
	// are missing.
	NextParked int64
	// Parked is how many messages of the entity are parked.
	Parked int
	// Since is when the oldest of them was parked.
	Since time.Time
	// Policy is the policy applied: GapHold, or GapDeadLetter when the
	// parked messages were handed to Ordering.DeadLetter.
	Policy GapPolicy
	// DeadLettered is how many parked messages were dead-lettered.
	DeadLettered int
}

// GapObserver is implemented by an Observer (WithObserver) that is told of
// each gap CheckGaps finds open longer than Ordering.GapTimeout.
type GapObserver interface {
	Gap(ctx context.Context, g Gap)
}

// CheckGaps looks at every entity of the consumer with parked messages.
// One whose next sequence is parked (an operator's skip from the CLI made
// it next) is released at once, in a transaction of its own; so is one
// with a stale copy, a parked message at or below the last applied
// sequence (after such a skip, the producer re-sent the parked sequence
// under another message key, and that message applied it): the copy is
// deleted, its claim kept, so that its redelivery is Duplicate. One whose
// oldest parked message waited longer than Ordering.GapTimeout is a gap:
// it is returned, told to the Observer if it is a GapObserver, and handled
// by Ordering.Policy. Run it periodically (every GapTimeout/2, say) in one
// process or several: every decision is taken under the entity's lock.
func (m *Middleware) CheckGaps(ctx context.Context) ([]Gap, error) {
	if m.ord == nil {
		return nil, errors.New("idempotent: CheckGaps: the Middleware was not created WithOrdering")
	}
	waiting, err := m.waiting(ctx)
	if err != nil {
		return nil, err
	}
	now := m.ret.clock()
	var gaps []Gap
	for _, g := range waiting {
		if g.NextParked <= g.LastSeq+1 {
			if err := m.releaseNext(ctx, g.OrderKey); err != nil {
				return gaps, err
			}
			continue
		}
		if now.Sub(g.Since) < m.ord.GapTimeout {
			continue
		}
		g.Policy = m.ord.Policy
		if g.Policy == GapDeadLetter {
			if g.DeadLettered, err = m.deadLetter(ctx, g.OrderKey); err != nil {
				return gaps, err
			}
		}
		if gob, ok := m.observer.(GapObserver); ok {
			gob.Gap(ctx, g)
		}
		gaps = append(gaps, g)
	}
	return gaps, nil
}

// Waiting returns every entity of the consumer with parked messages, with
// its last applied sequence, lowest parked sequence, count and oldest
// park, whatever its age; Policy and DeadLettered are zero.
func (m *Middleware) Waiting(ctx context.Context) ([]Gap, error) {
	if m.ord == nil {
		return nil, errors.New("idempotent: Waiting: the Middleware was not created WithOrdering")
	}
	return m.waiting(ctx)
}

func (m *Middleware) waiting(ctx context.Context) ([]Gap, error) {
	return m.ord.waiting(ctx, m.db, m.consumer)
}

// waiting lists consumer's entities with parked messages.
func (o *orderer) waiting(ctx context.Context, db *sql.DB, consumer string) ([]Gap, error) {
	rows, err := db.QueryContext(ctx, o.waitingSQL, consumer)
	if err != nil {
		return nil, fmt.Errorf("idempotent: consumer %q: read parking table: %w", consumer, err)
	}
	defer rows.Close()
	var out []Gap
	for rows.Next() {
		g := Gap{Consumer: consumer}
		var since int64
		if err := rows.Scan(&g.OrderKey, &g.LastSeq, &g.NextParked, &g.Parked, &since); err != nil {
			return nil, fmt.Errorf("idempotent: consumer %q: read parking table: %w", consumer, err)
		}
		g.Since = time.UnixMicro(since).UTC()
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotent: consumer %q: read parking table: %w", consumer, err)
	}
	return out, nil
}

// releaseNext deletes, under the entity's lock, its stale parked copies
// (see dropStale), then releases the parked messages that follow its last
// sequence without a gap.
func (m *Middleware) releaseNext(ctx context.Context, key string) error {
	var released []ParkedMessage
	_, err := m.run.run(ctx, key, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		if err := m.captureTxID(ctx, tx, st); err != nil {
			return err
		}
		last, parkedMax, err := m.ord.lock(ctx, tx, m.consumer, key)
		if err != nil {
			return err
		}
		if _, err := m.ord.dropStale(ctx, tx, m.consumer, key, last); err != nil {
			return err
		}
		released, err = m.release(ctx, tx, st, m.ord, key, last, parkedMax, true)
		return err
	})
	if err != nil {
		return fmt.Errorf("idempotent: consumer %q: %w", m.consumer, err)
	}
	m.observeReleased(ctx, released)
	return nil
}

// deadLetter hands every parked message of key to Ordering.DeadLetter and
// deletes it with its claim, under the entity's lock.
func (m *Middleware) deadLetter(ctx context.Context, key string) (int, error) {
	o := m.ord
	n := 0
	_, err := m.run.run(ctx, key, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		n = 0
		if err := m.captureTxID(ctx, tx, st); err != nil {
			return err
		}
		last, _, err := o.lock(ctx, tx, m.consumer, key)
		if err != nil {
			return err
		}
		parked, err := o.dropStale(ctx, tx, m.consumer, key, last)
		if err != nil {
			return err
		}
		for _, p := range parked {
			if err := o.DeadLetter(ctx, p); err != nil {
				return fmt.Errorf("idempotent: dead-letter parked message %q (ordering key %q, sequence %d): %w", p.Key, key, p.OrderSeq, err)
			}
			if _, err := tx.ExecContext(ctx, o.unparkSQL, m.consumer, key, p.OrderSeq); err != nil {
				return fmt.Errorf("idempotent: ordering key %q, sequence %d: unpark: %w", key, p.OrderSeq, err)
			}
			if _, err := tx.ExecContext(ctx, o.unclaimSQL, m.consumer, p.Key); err != nil {
				return fmt.Errorf("idempotent: ordering key %q, sequence %d: delete claim %q: %w", key, p.OrderSeq, p.Key, err)
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("idempotent: consumer %q: %w", m.consumer, err)
	}
	return n, nil
}

// ensureOrderSchema creates the sequence and parking tables if missing.
func (m *Middleware) ensureOrderSchema(ctx context.Context) error {
	t := m.ClaimTable()
	insp, ok := m.d.(dialect.SchemaInspector)
	if !ok {
		_, err := m.run.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
			for _, s := range m.ord.schema {
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("idempotent: ensure ordering tables of %s: %w", m.table, err)
		}
		return nil
	}
	objs := []dialect.SchemaObject{
		{Kind: dialect.ObjectTable, Table: m.ord.seqTable, CreateSQL: m.ord.schema[0]},
		{Kind: dialect.ObjectTable, Table: m.ord.parkTable, CreateSQL: m.ord.schema[1]},
	}
	missing, err := t.checkSchema(ctx, insp, objs, nil)
	if err != nil {
		return fmt.Errorf("idempotent: ensure ordering tables of %s: %w", m.table, err)
	}
	if len(missing) == 0 {
		return nil
	}
	return t.createMissing(ctx, insp, objs, missing)
}
