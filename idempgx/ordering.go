package idempgx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/parkrow"
)

// Ordering configures WithOrdering: idempotent.Ordering with a Release
// that takes a pgx.Tx.
type Ordering struct {
	// Release applies a parked message's effect in the transaction of the
	// delivery (or the SkipGap, or the CheckGaps) that made it next, after
	// its predecessor's effect, as idempotent.Ordering.Release does. Like
	// a handler, it must do all its work through tx. Required.
	Release func(ctx context.Context, tx pgx.Tx, p idempotent.ParkedMessage) error
	// GapTimeout, Policy and DeadLetter are idempotent.Ordering's.
	GapTimeout time.Duration
	Policy     idempotent.GapPolicy
	DeadLetter func(ctx context.Context, p idempotent.ParkedMessage) error
}

// WithOrdering makes ProcessMessage (and WrapMessage) keep, per ordering
// key, the producer's sequence order of the messages that carry one, as
// idempotent.WithOrdering does for the database/sql Middleware, on the
// same tables: an in-order message applies, one ahead is parked (outcome
// idempotent.Parked) and applied by Ordering.Release when its predecessor
// applies, one at or below the last applied is Duplicate, one an operator
// skipped fails with idempotent.ErrSkippedSequence. The statement that
// decides (dialect.Orderer's OrderAdvanceSQL) travels in the first round
// trip, with BEGIN and the claim, so an in-order message whose entity has
// nothing parked costs no round trip more than one without order.
// EnsureSchema creates the sequence and parking tables. Ordered messages
// run one per transaction, never coalesced (WithCoalescing); statements a
// handler queued are sent before a parked successor's Release runs;
// ProcessMessages refuses ordered messages with
// idempotent.ErrInvalidOrder. GapTimeout, Policy and DeadLetter are
// checked as idempotent.WithOrdering checks them. Default is off.
func WithOrdering(o Ordering) Option {
	return optionFunc(func(c *config) error {
		if o.Release == nil {
			return errors.New("idempgx: WithOrdering: nil Release")
		}
		c.ordering = &o
		return nil
	})
}

// orderer is the Middleware's ordering: its configuration and statements.
type orderer struct {
	Ordering
	advanceSQL, lockSQL, rowSQL, bumpSQL   string
	parkSQL, skipSQL, parkedSQL, unparkSQL string
	parkedRowsSQL, unclaimSQL              string
}

func newOrderer(d dialect.Orderer, t dialect.Table, o *Ordering) *orderer {
	return &orderer{
		Ordering: *o, advanceSQL: d.OrderAdvanceSQL(t), lockSQL: d.OrderLockSQL(t), rowSQL: d.OrderRowSQL(t),
		bumpSQL: d.OrderBumpSQL(t), parkSQL: d.ParkSQL(t), skipSQL: d.SkipSQL(t), parkedSQL: d.ParkedSQL(t),
		unparkSQL: d.UnparkSQL(t), parkedRowsSQL: d.ParkedRowsSQL(t), unclaimSQL: d.UnclaimSQL(t),
	}
}

// coreOrdering is the core Middleware's WithOrdering: the same gap settings,
// so that its EnsureSchema creates the tables, its CheckMessage validates
// ordering fields and its Waiting lists the gaps. Its Release is never
// called: every release of this Middleware's entities runs here, on pgx.
func (o *Ordering) coreOrdering() idempotent.Ordering {
	return idempotent.Ordering{
		Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error {
			return errors.New("idempgx: a parked message of an idempgx Middleware is released by its own SkipGap or CheckGaps")
		},
		GapTimeout: o.GapTimeout, Policy: o.Policy, DeadLetter: o.DeadLetter,
	}
}

// orderedClaim is the claim step of an ordered message: the message's claim
// and, in the same round trip, the advance of its entity's sequence row
// (OrderAdvanceSQL). On a duplicate claim the advance is rolled back with
// it.
type orderedClaim struct {
	one      *claimOne // not embedded: its wire path would skip the advance
	seqKey   string
	seq      int64
	row      bool  // the advance returned the row
	now, max int64 // its last_seq and parked_max
}

func (c *orderedClaim) queue(b *pgx.Batch) {
	c.one.queue(b)
	b.Queue(c.one.m.ord.advanceSQL, c.one.m.consumer, c.seqKey, c.seq)
}

func (c *orderedClaim) read(br pgx.BatchResults) (bool, error) {
	claimed, err := c.one.read(br)
	if err != nil {
		return false, err
	}
	err = br.QueryRow().Scan(&c.now, &c.max)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		c.row = false
	case err != nil:
		return false, fmt.Errorf("idempgx: ordering key %q: advance sequence row: %w", c.seqKey, err)
	default:
		c.row = true
	}
	return claimed, nil
}

// attemptOf returns the attempt of a context handed to a body.
func attemptOf(ctx context.Context) *attempt { return ctx.Value(claimKey{}).(*attempt) }

// processOrdered is ProcessMessage of a message with an ordering key.
func (m *Middleware) processOrdered(ctx context.Context, msg idempotent.Message, fn Func) (idempotent.Outcome, int, error) {
	if fn == nil {
		return 0, 0, errors.New("idempgx: ProcessMessage: nil function")
	}
	if ctx.Value(claimKey{}) != nil {
		return 0, 0, m.keyError(msg.Key, ErrNested)
	}
	if err := m.core.CheckMessage(msg); err != nil {
		return 0, 0, err
	}
	scope := m.preCheckScope(ctx)
	if m.seenBefore(ctx, scope, msg.Key) {
		return idempotent.Duplicate, 0, nil
	}
	c := &orderedClaim{one: &claimOne{m: m, at: msg.EventTime, key: msg.Key}, seqKey: msg.OrderKey, seq: msg.OrderSeq}
	if m.partitioned {
		c.one.day = msg.EventTime.UTC().Format(time.DateOnly)
	}
	var (
		claim    idempotent.Outcome
		outcome  idempotent.Outcome
		released []idempotent.ParkedMessage
	)
	attempts, err := m.run(ctx, msg.Key, c, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		outcome, released, err = m.ordered(ctx, tx, c, msg, fn)
		return err
	}, &claim)
	if err != nil {
		return 0, attempts, m.keyError(msg.Key, err)
	}
	if claim == idempotent.Duplicate {
		outcome = idempotent.Duplicate
	}
	if outcome != idempotent.Parked {
		// A parked message may still be dead-lettered with its claim.
		m.recordSeen(ctx, scope, msg.Key)
	}
	m.observeReleased(ctx, released)
	return outcome, attempts, nil
}

// ordered decides msg after its claim inserted and c's advance ran, as the
// core's ordered does (docs/ordering.md): it runs fn and releases the
// parked successors, parks msg, or ends the attempt as a duplicate.
func (m *Middleware) ordered(ctx context.Context, tx pgx.Tx, c *orderedClaim, msg idempotent.Message, fn Func) (idempotent.Outcome, []idempotent.ParkedMessage, error) {
	a, o, seq := attemptOf(ctx), m.ord, msg.OrderSeq
	last, parkedMax := c.now, c.max
	if !c.row {
		// At or below last_seq: the advance changed nothing and holds
		// the row's lock.
		var err error
		if last, parkedMax, err = m.readSeq(ctx, a, msg.OrderKey); err != nil {
			return 0, nil, err
		}
	} else if c.now == seq {
		last = seq - 1
	}
	switch {
	case seq <= last:
		state, _, err := m.lookup(ctx, a, msg.OrderKey, seq)
		if err != nil {
			return 0, nil, err
		}
		if state == "S" {
			return 0, nil, fmt.Errorf("%w: ordering key %q, sequence %d was skipped by an operator and its successors applied without it (last applied %d); it is not applied",
				idempotent.ErrSkippedSequence, msg.OrderKey, seq, last)
		}
		a.rollbackOnly = true
		return idempotent.Duplicate, nil, nil
	case seq > last+1:
		at, headers, err := parkrow.Encode(msg.EventTime, msg.Headers)
		if err != nil {
			return 0, nil, fmt.Errorf("idempgx: %w", err)
		}
		payload := msg.Payload
		if payload == nil {
			payload = []byte{}
		}
		tag, err := a.l.c.Exec(ctx, o.parkSQL, m.consumer, msg.OrderKey, seq, msg.Key, payload, headers, at, m.clock().UnixMicro())
		if err != nil {
			return 0, nil, fmt.Errorf("idempgx: ordering key %q, sequence %d: park: %w", msg.OrderKey, seq, err)
		}
		if tag.RowsAffected() == 0 {
			// Another message with the same sequence waits already.
			a.rollbackOnly = true
			return idempotent.Duplicate, nil, nil
		}
		return idempotent.Parked, nil, nil
	}
	if err := fn(ctx, tx); err != nil {
		return 0, nil, err
	}
	released, err := m.release(ctx, tx, msg.OrderKey, seq, parkedMax)
	return idempotent.Applied, released, err
}

// readSeq locks the entity's sequence row, which exists, and reads it.
func (m *Middleware) readSeq(ctx context.Context, a *attempt, key string) (last, parkedMax int64, err error) {
	if err := a.l.c.QueryRow(ctx, m.ord.lockSQL, m.consumer, key).Scan(&last, &parkedMax); err != nil {
		return 0, 0, fmt.Errorf("idempgx: ordering key %q: lock sequence row: %w", key, err)
	}
	return last, parkedMax, nil
}

// lookup reads the parking table's row of one sequence: state "" when
// there is none.
func (m *Middleware) lookup(ctx context.Context, a *attempt, key string, seq int64) (state string, p idempotent.ParkedMessage, err error) {
	var headers string
	var at int64
	err = a.l.c.QueryRow(ctx, m.ord.parkedSQL, m.consumer, key, seq).Scan(&state, &p.Key, &p.Payload, &headers, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", p, nil
	}
	if err != nil {
		return "", p, fmt.Errorf("idempgx: ordering key %q, sequence %d: read parking table: %w", key, seq, err)
	}
	p.OrderKey, p.OrderSeq = key, seq
	if p.EventTime, p.Headers, err = parkrow.Decode(at, headers); err != nil {
		return "", p, fmt.Errorf("idempgx: ordering key %q, sequence %d: %w", key, seq, err)
	}
	return state, p, nil
}

// release applies, in tx, every parked message of key that follows last
// without a gap, up to parkedMax, through Ordering.Release, each leaving
// the parking table and becoming the last applied before its Release
// runs. The row must be locked by the attempt, and last_seq be last. The
// statements a handler queued are sent first, so that a released effect
// follows its predecessor's.
func (m *Middleware) release(ctx context.Context, tx pgx.Tx, key string, last, parkedMax int64) ([]idempotent.ParkedMessage, error) {
	a, o := attemptOf(ctx), m.ord
	var released []idempotent.ParkedMessage
	for last < parkedMax {
		state, p, err := m.lookup(ctx, a, key, last+1)
		if err != nil {
			return nil, err
		}
		if state != "P" {
			break
		}
		if err := a.flushQueued(ctx); err != nil {
			return nil, err
		}
		if _, err := a.l.c.Exec(ctx, o.unparkSQL, m.consumer, key, p.OrderSeq); err != nil {
			return nil, fmt.Errorf("idempgx: ordering key %q, sequence %d: unpark: %w", key, p.OrderSeq, err)
		}
		if _, err := a.l.c.Exec(ctx, o.bumpSQL, p.OrderSeq, m.consumer, key); err != nil {
			return nil, fmt.Errorf("idempgx: ordering key %q: set last sequence %d: %w", key, p.OrderSeq, err)
		}
		if err := o.Release(ctx, tx, p); err != nil {
			return nil, fmt.Errorf("idempgx: release parked message %q (ordering key %q, sequence %d): %w", p.Key, key, p.OrderSeq, err)
		}
		released = append(released, p)
		last++
	}
	return released, nil
}

// flushQueued sends the statements the attempt's handlers queued so far.
func (a *attempt) flushQueued(ctx context.Context) error {
	qs := a.tx.queue
	if len(qs) == 0 {
		return nil
	}
	a.tx.queue = nil
	var b pgx.Batch
	queueInto(&b, qs)
	br := a.l.c.SendBatch(ctx, &b)
	err := readQueued(br, qs)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}

// observeReleased tells the observer of each released message, Applied.
func (m *Middleware) observeReleased(ctx context.Context, released []idempotent.ParkedMessage) {
	if m.observer == nil {
		return
	}
	for _, p := range released {
		m.observer.Outcome(ctx, idempotent.Event{Consumer: m.consumer, Key: p.Key, Outcome: idempotent.Applied, Attempts: 1})
	}
}

// noClaim is the claim step of a transaction that claims nothing (SkipGap,
// CheckGaps): BEGIN alone.
type noClaim struct{}

func (noClaim) queue(*pgx.Batch)                    {}
func (noClaim) read(pgx.BatchResults) (bool, error) { return true, nil }

// SkipGap is idempotent.Middleware.SkipGap on pgx: it marks every sequence
// of orderKey after the last applied, up to and including seq, as skipped,
// and applies the parked messages that follow without a gap, through
// Ordering.Release, in one transaction. It returns how many it applied,
// and fails, changing nothing, as the core's does.
func (m *Middleware) SkipGap(ctx context.Context, orderKey string, seq int64) (int, error) {
	if m.ord == nil {
		return 0, errors.New("idempgx: SkipGap: the Middleware was not created WithOrdering")
	}
	if err := m.core.CheckMessage(idempotent.Message{Key: "skip", OrderKey: orderKey, OrderSeq: seq}); err != nil {
		return 0, fmt.Errorf("idempgx: SkipGap: %w", err)
	}
	o := m.ord
	var released []idempotent.ParkedMessage
	err := m.inOrderTx(ctx, orderKey, func(ctx context.Context, a *attempt, tx pgx.Tx, last, parkedMax int64) error {
		released = nil
		switch {
		case seq <= last:
			return fmt.Errorf("%w: SkipGap: ordering key %q: sequence %d is not ahead of the last applied, %d", idempotent.ErrInvalidOrder, orderKey, seq, last)
		case seq-last > idempotent.MaxSkip:
			return fmt.Errorf("%w: SkipGap: ordering key %q: skipping %d..%d is more than %d sequences", idempotent.ErrInvalidOrder, orderKey, last+1, seq, idempotent.MaxSkip)
		}
		parked, err := m.dropStale(ctx, a, orderKey, last)
		if err != nil {
			return err
		}
		if len(parked) > 0 && parked[0].OrderSeq <= seq {
			first := parked[0].OrderSeq
			return fmt.Errorf("%w: SkipGap: ordering key %q: sequence %d is parked, not missing; skip at most up to %d", idempotent.ErrInvalidOrder, orderKey, first, first-1)
		}
		now := m.clock().UnixMicro()
		var b pgx.Batch
		for s := last + 1; s <= seq; s++ {
			b.Queue(o.skipSQL, m.consumer, orderKey, s, now)
		}
		b.Queue(o.bumpSQL, seq, m.consumer, orderKey)
		if err := a.l.c.SendBatch(ctx, &b).Close(); err != nil {
			return fmt.Errorf("idempgx: SkipGap: ordering key %q: %w", orderKey, err)
		}
		released, err = m.release(ctx, tx, orderKey, seq, parkedMax)
		return err
	})
	if err != nil {
		return 0, err
	}
	m.observeReleased(ctx, released)
	return len(released), nil
}

// Waiting is idempotent.Middleware.Waiting: every entity of the consumer
// with parked messages.
func (m *Middleware) Waiting(ctx context.Context) ([]idempotent.Gap, error) {
	if m.ord == nil {
		return nil, errors.New("idempgx: Waiting: the Middleware was not created WithOrdering")
	}
	return m.core.Waiting(ctx)
}

// CheckGaps is idempotent.Middleware.CheckGaps on pgx: an entity whose next
// sequence is parked (an operator's skip made it next), or with a stale
// parked copy at or below its last applied sequence, is released at once
// through Ordering.Release, in a transaction of its own; one whose oldest
// parked message waited longer than Ordering.GapTimeout is a gap: it is
// returned, told to the Observer if it is an idempotent.GapObserver, and
// handled by Ordering.Policy. Every decision is taken under the entity's
// lock.
func (m *Middleware) CheckGaps(ctx context.Context) ([]idempotent.Gap, error) {
	if m.ord == nil {
		return nil, errors.New("idempgx: CheckGaps: the Middleware was not created WithOrdering")
	}
	waiting, err := m.core.Waiting(ctx)
	if err != nil {
		return nil, err
	}
	timeout := m.ord.GapTimeout
	if timeout == 0 {
		timeout = idempotent.DefaultGapTimeout
	}
	now := m.clock()
	var gaps []idempotent.Gap
	for _, g := range waiting {
		if g.NextParked <= g.LastSeq+1 {
			if err := m.releaseNext(ctx, g.OrderKey); err != nil {
				return gaps, err
			}
			continue
		}
		if now.Sub(g.Since) < timeout {
			continue
		}
		g.Policy = m.ord.Policy
		if g.Policy == idempotent.GapDeadLetter {
			if g.DeadLettered, err = m.deadLetter(ctx, g.OrderKey); err != nil {
				return gaps, err
			}
		}
		if gob, ok := m.observer.(idempotent.GapObserver); ok {
			gob.Gap(ctx, g)
		}
		gaps = append(gaps, g)
	}
	return gaps, nil
}

// inOrderTx runs body in a transaction of its own that claims nothing,
// with the entity's sequence row created if missing and locked, under the
// retry policy.
func (m *Middleware) inOrderTx(ctx context.Context, key string, body func(ctx context.Context, a *attempt, tx pgx.Tx, last, parkedMax int64) error) error {
	var outcome idempotent.Outcome
	_, err := m.run(ctx, key, noClaim{}, func(ctx context.Context, tx pgx.Tx) error {
		a := attemptOf(ctx)
		if _, err := a.l.c.Exec(ctx, m.ord.rowSQL, m.consumer, key); err != nil {
			return fmt.Errorf("idempgx: ordering key %q: insert sequence row: %w", key, err)
		}
		last, parkedMax, err := m.readSeq(ctx, a, key)
		if err != nil {
			return err
		}
		return body(ctx, a, tx, last, parkedMax)
	}, &outcome)
	if err != nil {
		return fmt.Errorf("idempgx: consumer %q: %w", m.consumer, err)
	}
	return nil
}

// releaseNext deletes, under the entity's lock, its stale parked copies,
// then releases the parked messages that follow its last sequence without
// a gap.
func (m *Middleware) releaseNext(ctx context.Context, key string) error {
	var released []idempotent.ParkedMessage
	err := m.inOrderTx(ctx, key, func(ctx context.Context, a *attempt, tx pgx.Tx, last, parkedMax int64) error {
		if _, err := m.dropStale(ctx, a, key, last); err != nil {
			return err
		}
		var err error
		released, err = m.release(ctx, tx, key, last, parkedMax)
		return err
	})
	if err == nil {
		m.observeReleased(ctx, released)
	}
	return err
}

// deadLetter hands every parked message of key to Ordering.DeadLetter and
// deletes it with its claim, under the entity's lock.
func (m *Middleware) deadLetter(ctx context.Context, key string) (int, error) {
	o, n := m.ord, 0
	err := m.inOrderTx(ctx, key, func(ctx context.Context, a *attempt, _ pgx.Tx, last, _ int64) error {
		n = 0
		parked, err := m.dropStale(ctx, a, key, last)
		if err != nil {
			return err
		}
		for _, p := range parked {
			if err := o.DeadLetter(ctx, p); err != nil {
				return fmt.Errorf("idempgx: dead-letter parked message %q (ordering key %q, sequence %d): %w", p.Key, key, p.OrderSeq, err)
			}
			if _, err := a.l.c.Exec(ctx, o.unparkSQL, m.consumer, key, p.OrderSeq); err != nil {
				return fmt.Errorf("idempgx: ordering key %q, sequence %d: unpark: %w", key, p.OrderSeq, err)
			}
			if _, err := a.l.c.Exec(ctx, o.unclaimSQL, m.consumer, p.Key); err != nil {
				return fmt.Errorf("idempgx: ordering key %q, sequence %d: delete claim %q: %w", key, p.OrderSeq, p.Key, err)
			}
			n++
		}
		return nil
	})
	return n, err
}

// dropStale deletes, under the entity's lock, its stale parked copies
// (parked messages at or below last, its last applied sequence: see the
// core's CheckGaps) and returns the others, in sequence order.
func (m *Middleware) dropStale(ctx context.Context, a *attempt, key string, last int64) ([]idempotent.ParkedMessage, error) {
	o := m.ord
	rows, err := a.l.c.Query(ctx, o.parkedRowsSQL, m.consumer, key)
	if err != nil {
		return nil, fmt.Errorf("idempgx: ordering key %q: read parking table: %w", key, err)
	}
	var parked []idempotent.ParkedMessage
	for rows.Next() {
		p := idempotent.ParkedMessage{Message: idempotent.Message{OrderKey: key}}
		var headers string
		var at, parkedAt int64
		if err := rows.Scan(&p.OrderSeq, &p.Key, &p.Payload, &headers, &at, &parkedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("idempgx: ordering key %q: read parking table: %w", key, err)
		}
		p.ParkedAt = time.UnixMicro(parkedAt).UTC()
		if p.EventTime, p.Headers, err = parkrow.Decode(at, headers); err != nil {
			rows.Close()
			return nil, fmt.Errorf("idempgx: ordering key %q, sequence %d: %w", key, p.OrderSeq, err)
		}
		parked = append(parked, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempgx: ordering key %q: read parking table: %w", key, err)
	}
	n := 0
	for n < len(parked) && parked[n].OrderSeq <= last {
		if _, err := a.l.c.Exec(ctx, o.unparkSQL, m.consumer, key, parked[n].OrderSeq); err != nil {
			return nil, fmt.Errorf("idempgx: ordering key %q, sequence %d: delete the stale parked copy of a sequence applied: %w", key, parked[n].OrderSeq, err)
		}
		n++
	}
	return parked[n:], nil
}
