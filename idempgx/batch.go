package idempgx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/seencheck"
)

// BatchFunc applies the effects of a batch's new messages inside the
// transaction that claimed them, as idempotent.BatchFunc does: fresh holds
// the indexes, in the batch given to ProcessMessages, of the messages
// whose claims were new, in ascending order, and is never empty.
type BatchFunc func(ctx context.Context, tx pgx.Tx, fresh []int) error

// BatchHandler applies the effects of a batch's new decoded messages, given
// in their order in the batch, inside the transaction that claimed them, as
// idempotent.BatchHandler does.
type BatchHandler[M any] func(ctx context.Context, tx pgx.Tx, msgs []M) error

// WrapMessages turns a handler of decoded messages into a function that
// processes a batch of them exactly once with ProcessMessages, as
// idempotent.WrapMessages does: h runs once per batch with the new
// messages, and not at all when every one is a duplicate. If msg fails for
// any message, the returned function fails the whole batch with an
// *idempotent.BatchKeyError matching idempotent.ErrInvalidKey that names
// the message's index, without taking a connection.
func WrapMessages[M any](m *Middleware, msg func(M) (idempotent.Message, error), h BatchHandler[M]) func(ctx context.Context, msgs []M) ([]idempotent.Outcome, error) {
	return func(ctx context.Context, vs []M) ([]idempotent.Outcome, error) {
		if len(vs) == 0 {
			return nil, nil
		}
		fail := func(err error) ([]idempotent.Outcome, error) {
			m.observe(ctx, "", 0, 0, time.Time{}, err)
			return nil, err
		}
		if msg == nil || h == nil {
			return fail(errors.New("idempgx: WrapMessages: nil message function or handler"))
		}
		if len(vs) > idempotent.MaxBatchSize {
			return fail(fmt.Errorf("%w: %d messages, the limit is %d", idempotent.ErrBatchTooLarge, len(vs), idempotent.MaxBatchSize))
		}
		msgs := make([]idempotent.Message, len(vs))
		for i, v := range vs {
			mm, err := msg(v)
			if err != nil {
				return fail(&idempotent.BatchKeyError{Index: i, Err: fmt.Errorf("%w: key function: %w", idempotent.ErrInvalidKey, err)})
			}
			msgs[i] = mm
		}
		return m.ProcessMessages(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
			sel := make([]M, len(fresh))
			for j, i := range fresh {
				sel[j] = vs[i]
			}
			return h(ctx, tx, sel)
		})
	}
}

// ProcessMessages applies the effects of a batch of messages exactly once
// for this consumer, in one transaction, with the semantics of
// idempotent.Middleware.ProcessMessages: one Outcome per message, in order;
// a key repeated in the batch is applied at most once; fn runs once for the
// new messages and not at all when every message is a duplicate.
//
// BEGIN and the batch's claim — one INSERT … SELECT FROM unnest($2::text[])
// with the keys as a native []string, in ascending order so that
// overlapping batches cannot deadlock, and in partitioned mode with each
// key's event day as a second array, so that each claim goes to its day's
// partition — travel in one round trip. Bad input is refused before
// anything is sent: more than idempotent.MaxBatchSize messages fail with
// idempotent.ErrBatchTooLarge, and a message whose key is invalid or whose
// event time the retention fence refuses (as ProcessMessage) fails the whole
// batch with an *idempotent.BatchKeyError naming its index; so does, in
// partitioned mode, a key given twice with event times on different days. A
// day without its partition yet fails the batch with
// idempotent.ErrNoPartition, which is transient. The duplicate pre-check
// (WithSeen) is consulted as by the core's ProcessMessages: keys it knows are
// Duplicate and not claimed, a batch it knows whole opens no transaction,
// and the claimed keys are recorded after the commit (in one call where it
// is an idempotent.SeenBatch).
func (m *Middleware) ProcessMessages(ctx context.Context, msgs []idempotent.Message, fn BatchFunc) ([]idempotent.Outcome, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	var start time.Time
	if m.observer != nil {
		start = time.Now()
	}
	outcomes, attempts, err := m.processMessages(ctx, msgs, fn)
	if m.observer != nil {
		for i, msg := range msgs {
			var o idempotent.Outcome
			if err == nil {
				o = outcomes[i]
			}
			m.observe(ctx, msg.Key, o, attempts, start, err)
		}
	}
	return outcomes, err
}

func (m *Middleware) processMessages(ctx context.Context, msgs []idempotent.Message, fn BatchFunc) ([]idempotent.Outcome, int, error) {
	if fn == nil {
		return nil, 0, errors.New("idempgx: ProcessMessages: nil function")
	}
	if ctx.Value(claimKey{}) != nil {
		return nil, 0, fmt.Errorf("idempgx: consumer %q, batch of %d: %w", m.consumer, len(msgs), ErrNested)
	}
	if len(msgs) > idempotent.MaxBatchSize {
		return nil, 0, fmt.Errorf("%w: %d messages, the limit is %d", idempotent.ErrBatchTooLarge, len(msgs), idempotent.MaxBatchSize)
	}
	for i, msg := range msgs {
		err := m.core.CheckMessage(msg)
		if err == nil && (msg.OrderKey != "" || msg.OrderSeq != 0) {
			err = fmt.Errorf("%w: key %q: a batch does not keep order; process ordered messages with ProcessMessage (or WrapMessage)", idempotent.ErrInvalidOrder, msg.Key)
		}
		if err != nil {
			return nil, 0, &idempotent.BatchKeyError{Index: i, Err: err}
		}
	}
	order := make([]int, len(msgs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Or(strings.Compare(msgs[a].Key, msgs[b].Key), a-b) })
	c := &claimBatch{m: m, uniq: make([]string, 0, len(msgs))}
	first := make([]int, 0, len(msgs))
	for _, i := range order {
		if n := len(c.uniq); n > 0 && c.uniq[n-1] == msgs[i].Key {
			if f := msgs[first[n-1]]; m.partitioned && utcDay(f.EventTime) != utcDay(msgs[i].EventTime) {
				return nil, 0, &idempotent.BatchKeyError{Index: i, Err: fmt.Errorf("%w: consumer %q, key %q: event day %s, but message %d with the same key has event day %s",
					idempotent.ErrInvalidEventTime, m.consumer, msgs[i].Key, utcDay(msgs[i].EventTime), first[n-1], utcDay(f.EventTime))}
			}
			continue
		}
		c.uniq = append(c.uniq, msgs[i].Key)
		first = append(first, i)
	}
	// The pre-check: keys it knows are duplicates, and are not claimed.
	scope := m.preCheckScope(ctx)
	if hit := m.seenKeys(ctx, scope, c.uniq); hit != nil {
		if c.uniq, first = seencheck.Unknown(hit, c.uniq, first); len(c.uniq) == 0 {
			outcomes := make([]idempotent.Outcome, len(msgs))
			for i := range outcomes {
				outcomes[i] = idempotent.Duplicate
			}
			return outcomes, 0, nil
		}
	}
	c.first = first
	c.times(func(i int) time.Time { return msgs[i].EventTime })
	var outcome idempotent.Outcome
	attempts, err := m.run(ctx, "", c, func(ctx context.Context, tx pgx.Tx) error {
		var fresh []int
		for j, ok := range c.isNew {
			if ok {
				fresh = append(fresh, first[j])
			}
		}
		slices.Sort(fresh)
		return fn(ctx, tx, fresh)
	}, &outcome)
	if err != nil {
		return nil, attempts, fmt.Errorf("idempgx: consumer %q, batch of %d: %w", m.consumer, len(msgs), err)
	}
	outcomes := make([]idempotent.Outcome, len(msgs))
	for i := range outcomes {
		outcomes[i] = idempotent.Duplicate
	}
	for j, ok := range c.isNew {
		if ok {
			outcomes[first[j]] = idempotent.Applied
		}
	}
	m.recordSeenKeys(ctx, scope, c.uniq)
	return outcomes, attempts, nil
}

// utcDay returns t's UTC day as YYYY-MM-DD.
func utcDay(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// claimBatch is the batch claim step: the distinct keys in ascending order,
// and which of them were new in the current attempt.
type claimBatch struct {
	m     *Middleware
	uniq  []string
	first []int       // the index in the batch of uniq[j]'s first message
	days  []string    // uniq[j]'s event day, in partitioned mode
	ats   []time.Time // uniq[j]'s event time (zero for none); nil when no message has one
	isNew []bool
}

// times sets, from at(i), the event time of the batch's i-th message, the
// event times of the batch's distinct keys and, in partitioned mode, their
// event days, and makes isNew ready for the claim.
func (c *claimBatch) times(at func(i int) time.Time) {
	if c.m.partitioned {
		c.days = make([]string, len(c.uniq))
	}
	for j, i := range c.first {
		if t := at(i); !t.IsZero() {
			if c.ats == nil {
				c.ats = make([]time.Time, len(c.uniq))
			}
			c.ats[j] = t
			if c.days != nil {
				c.days[j] = utcDay(t)
			}
		}
	}
	c.isNew = make([]bool, len(c.uniq))
}

// queue adds the batch claim and, when any message has an event time, the
// horizon's read after it: a statement of its own, so that it runs after the
// insert, in the claim's transaction, in the same round trip.
func (c *claimBatch) queue(b *pgx.Batch) {
	if c.days != nil {
		b.Queue(c.m.batchAtSQL, c.m.consumer, c.uniq, c.days)
	} else {
		b.Queue(c.m.batchSQL, c.m.consumer, c.uniq)
	}
	if c.ats != nil {
		b.Queue(c.m.horizonSQL, c.m.horizonArgs...)
	}
}

// read reads which keys the batch claim inserted and, after it, the
// horizon: a new claim older than it fails the batch with a BatchKeyError
// naming its first message.
func (c *claimBatch) read(br pgx.BatchResults) (bool, error) {
	claimed, err := c.readClaims(br)
	if err != nil || c.ats == nil {
		return claimed, err
	}
	var h *int64
	if err := br.QueryRow().Scan(&h); err != nil {
		return false, fmt.Errorf("idempgx: batch claim: read the retention horizon: %w", err)
	}
	for j, ok := range c.isNew {
		if ok && c.m.beyond(c.ats[j], h) {
			return false, &idempotent.BatchKeyError{Index: c.first[j], Err: c.m.beyondHorizon(c.uniq[j], c.ats[j], *h)}
		}
	}
	return claimed, nil
}

// readClaims reads the keys the batch claim returned, the new ones.
func (c *claimBatch) readClaims(br pgx.BatchResults) (bool, error) {
	clear(c.isNew)
	rows, err := br.Query()
	if err != nil {
		return false, c.claimError(err)
	}
	defer rows.Close()
	any := false
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return false, fmt.Errorf("idempgx: batch claim: %w", err)
		}
		j, found := slices.BinarySearch(c.uniq, k)
		if !found {
			return false, fmt.Errorf("idempgx: batch claim: the database returned key %q, which is not in the batch", k)
		}
		c.isNew[j] = true
		any = true
	}
	if err := rows.Err(); err != nil {
		return false, c.claimError(err)
	}
	return any, nil
}

// claimError is the Middleware's claimError for the batch's days; a day
// without its partition names the batch's keys, so that its resolution
// names the first message of a dropped day.
func (c *claimBatch) claimError(err error) error {
	var days []time.Time
	if c.days != nil {
		days = c.ats
	}
	err = c.m.claimError(err, days...)
	var md *missingDay
	if errors.As(err, &md) {
		md.keys, md.index = c.uniq, c.first
	}
	return err
}
