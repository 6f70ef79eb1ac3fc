package idempotent

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/seencheck"
)

// MaxBatchSize is the most messages one call of ProcessMessages,
// ProcessMessagesTx, WrapMessages or WrapMessagesTx accepts. It keeps one
// batch's claim statement, its locks and its transaction short; split
// larger batches.
const MaxBatchSize = 1000

// ErrBatchTooLarge reports a batch of more than MaxBatchSize messages.
// Nothing was sent to the database.
var ErrBatchTooLarge = errors.New("idempotent: batch too large")

// BatchKeyError reports the message of a batch that cannot be claimed: its
// key is invalid, or its event time is refused by the retention fence. The
// whole batch was refused and nothing was written. Err matches
// ErrInvalidKey for a bad key, ErrBeyondRetention for an event time older
// than the retention window, ErrInvalidEventTime for one in the future (or
// a zero one in partitioned mode, or one that differs in its day from an
// earlier message with the same key); errors.Is on the BatchKeyError sees
// through it. Use errors.As to learn which message to set aside.
type BatchKeyError struct {
	// Index is the message's index in the batch.
	Index int
	// Err says what is wrong with its key or event time.
	Err error
}

// Error describes the failure.
func (e *BatchKeyError) Error() string {
	return fmt.Sprintf("idempotent: batch message %d: %v", e.Index, e.Err)
}

// Unwrap returns the message's error.
func (e *BatchKeyError) Unwrap() error { return e.Err }

// BatchFunc applies the effects of a batch's new messages inside the
// transaction that claimed them. fresh holds the indexes, in the batch given
// to ProcessMessages, of the messages whose claims were new, in ascending order
// — except that, with WithOrdering, the ordered messages of one entity are
// placed in sequence order in the positions they hold, and those that do not
// apply now (parked, or duplicates of a sequence) are left out; it is never
// empty. Like TxFunc, it must do all its work through tx, with
// ctx, and must not commit or roll back tx. It may run more than once if the
// batch is retried, each time with a fresh slice.
type BatchFunc func(ctx context.Context, tx *sql.Tx, fresh []int) error

// BatchHandler applies the effects of a batch's new messages, given in their
// order in the batch, inside the transaction that claimed them. A handler
// that locks rows should touch them in a stable order (sorted by primary key,
// say) so that concurrent batches cannot deadlock; deadlocks are retried, but
// they cost a whole batch.
type BatchHandler[M any] func(ctx context.Context, tx *sql.Tx, msgs []M) error

// ProcessMessages applies the effects of a batch of messages exactly once
// for this consumer, in one transaction: it claims every message, runs fn
// once for the messages whose claims were new, and commits claims and
// effects together. It returns one Outcome per message, in the order of
// msgs: Applied for a message whose effect fn applied, Duplicate for one
// claimed before. A key that occurs more than once in the batch is applied
// once: its first occurrence may be Applied, the later ones are Duplicate.
// If every message is a duplicate, fn does not run and nothing is
// committed; with a pre-check (WithSeen) that knows every key, no
// transaction is opened at all.
//
// The claims are taken in ascending byte order of their keys, so two
// overlapping batches wait for each other instead of deadlocking on their
// claims. With a dialect that implements dialect.BatchClaimer (the Postgres
// one does) a batch is claimed by one statement, and in partitioned mode
// too where it implements dialect.PartitionedBatchClaimer (the Postgres one
// does: each key goes to its event day's partition); otherwise each key is
// claimed by its own statement, in the same order and transaction.
//
// Event times work as for ProcessMessage, message by message: each message
// that carries one passes the retention fence, and in partitioned mode each
// claim goes into its own event day's partition, so a batch may span days.
// Bad input is refused before anything is sent: an empty batch returns
// (nil, nil) at once, a batch of more than MaxBatchSize messages fails with
// ErrBatchTooLarge, and a message that cannot be claimed fails the whole
// batch with a *BatchKeyError naming its index — an invalid key
// (ErrInvalidKey), an event time older than the retention window
// (ErrBeyondRetention), one in the future or, in partitioned mode, a zero
// one (ErrInvalidEventTime). A key given twice with event times on
// different days is refused too, in partitioned mode (ErrInvalidEventTime,
// at the later index): the two would be claimed in different partitions.
// The rest of the batch is not applied either: set the message aside (to a
// dead-letter queue) and process the others again. A day inside the window
// that has no partition yet fails the whole batch with ErrNoPartition,
// which is transient.
//
// With WithOrdering, a batch may hold ordered messages (see
// docs/ordering.md), and several of one entity, in any order. After the
// claims, the entities' sequence rows are locked in ascending order of
// their ordering keys. Each entity's messages that follow its last applied
// sequence without a gap are given to fn, in sequence order; then its
// parked successors apply through Ordering.Release, in the same
// transaction — those parked by earlier deliveries and those this batch
// parked, which are then Applied. A message further ahead is Parked; one
// at or below the applied sequence, or a second message with the same
// sequence, is Duplicate and its claim is not kept; one whose sequence an
// operator skipped fails the batch with a *BatchKeyError matching
// ErrSkippedSequence.
//
// Failures are handled as by ProcessMessage, for the batch as a whole: an
// error from fn rolls back every claim and effect of the batch;
// serialization failures, deadlocks and lost connections retry the whole
// batch under the retry policy. An Observer is told one Event per message,
// each carrying the batch's attempts and duration; retries are reported
// with an empty Key.
func (m *Middleware) ProcessMessages(ctx context.Context, msgs []Message, fn BatchFunc) ([]Outcome, error) {
	return m.processObserved(ctx, &m.run, msgs, fn)
}

// processObserved is processMessages for the exported batch entry points:
// an empty batch returns at once, and the observer is told every message.
func (m *Middleware) processObserved(ctx context.Context, r *runner, msgs []Message, fn BatchFunc) ([]Outcome, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	start := time.Now()
	outcomes, attempts, err := m.processMessages(ctx, r, msgs, fn)
	m.observeBatch(ctx, msgs, outcomes, attempts, time.Since(start), err)
	return outcomes, err
}

// processMessages is the one batch path, under r's retries:
// ProcessMessages, ProcessMessagesTx, WrapMessages and WrapMessagesTx all
// end here.
func (m *Middleware) processMessages(ctx context.Context, r *runner, msgs []Message, fn BatchFunc) ([]Outcome, int, error) {
	if fn == nil {
		return nil, 0, errors.New("idempotent: ProcessMessages: nil function")
	}
	if len(msgs) > MaxBatchSize {
		return nil, 0, batchTooLarge(len(msgs))
	}
	for i, msg := range msgs {
		if err := m.checkMessage(msg); err != nil {
			return nil, 0, &BatchKeyError{Index: i, Err: err}
		}
	}
	// uniq holds the distinct keys in ascending order, first[j] the index
	// of uniq[j]'s first occurrence in msgs.
	order := make([]int, len(msgs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Or(strings.Compare(msgs[a].Key, msgs[b].Key), a-b) })
	uniq := make([]string, 0, len(msgs))
	first := make([]int, 0, len(msgs))
	for _, i := range order {
		if n := len(uniq); n > 0 && uniq[n-1] == msgs[i].Key {
			if f := msgs[first[n-1]]; m.ret.part != nil && !eventDay(f.EventTime).Equal(eventDay(msgs[i].EventTime)) {
				return nil, 0, &BatchKeyError{Index: i, Err: fmt.Errorf("%w: consumer %q, key %q: event day %s, but message %d with the same key has event day %s",
					ErrInvalidEventTime, m.consumer, msgs[i].Key, eventDay(msgs[i].EventTime).Format(time.DateOnly), first[n-1], eventDay(f.EventTime).Format(time.DateOnly))}
			}
			continue
		}
		uniq = append(uniq, msgs[i].Key)
		first = append(first, i)
	}
	// The pre-check: keys it knows are duplicates, and are not claimed.
	scope := m.preCheckScope(ctx)
	if hit := m.seenKeys(ctx, scope, uniq); hit != nil {
		if uniq, first = seencheck.Unknown(hit, uniq, first); len(uniq) == 0 {
			outcomes := make([]Outcome, len(msgs))
			for i := range outcomes {
				outcomes[i] = Duplicate
			}
			return outcomes, 0, nil
		}
	}
	ats := make([]time.Time, len(uniq)) // the event time of uniq[j]
	for j, i := range first {
		ats[j] = msgs[i].EventTime
	}
	var days []time.Time // ats, in partitioned mode
	if m.ret.part != nil {
		days = ats
	}

	outcomes := make([]Outcome, len(msgs))
	isNew := make([]bool, len(uniq))
	var bo *batchOrder
	attempts, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		clear(isNew)
		bo = nil
		claimed, err := m.claimBatch(ctx, tx, st, batchClaim{uniq: uniq, first: first, ats: ats, days: days}, isNew)
		if err != nil {
			return err
		}
		if !claimed {
			st.skipCommit = true
			return nil
		}
		var fresh []int
		for j, ok := range isNew {
			if ok {
				fresh = append(fresh, first[j])
			}
		}
		slices.Sort(fresh)
		if m.ord != nil {
			if fresh, bo, err = m.orderBatch(ctx, tx, msgs, fresh); err != nil {
				return err
			}
		}
		if len(fresh) > 0 {
			st.inHandler = true
			if err := fn(ctx, tx, fresh); err != nil {
				return err
			}
			st.inHandler = false
		}
		return m.releaseBatch(ctx, tx, st, msgs, bo)
	})
	if err != nil {
		err = m.reclassify(ctx, err)
		return nil, attempts, fmt.Errorf("idempotent: consumer %q, batch of %d: %w", m.consumer, len(msgs), err)
	}
	for i := range outcomes {
		outcomes[i] = Duplicate
	}
	for j, ok := range isNew {
		if ok {
			outcomes[first[j]] = Applied
		}
	}
	if bo == nil {
		m.recordSeenKeys(ctx, scope, uniq)
		return outcomes, attempts, nil
	}
	seen := uniq[:0:0]
	for j, k := range uniq {
		i := first[j]
		if o, ok := bo.outcome[i]; ok {
			outcomes[i] = o
		}
		// A parked message is not applied yet (see claimAndRun).
		if outcomes[i] != Parked {
			seen = append(seen, k)
		}
	}
	m.recordSeenKeys(ctx, scope, seen)
	m.observeReleased(ctx, bo.others)
	return outcomes, attempts, nil
}

// batchOrder is what the ordered messages of a batch came to in one
// attempt's transaction (orderBatch, releaseBatch).
type batchOrder struct {
	// outcome holds the ordered messages that fn does not apply, by index
	// in the batch: Duplicate, Parked, or Applied for one parked and then
	// released in the same transaction.
	outcome map[int]Outcome
	// chains are the entities some of whose messages fn applies, with the
	// last sequence it applies: their parked successors follow.
	chains []orderChain
	// parked maps the key of each message parked in this transaction to
	// its index in the batch.
	parked map[string]int
	// others are the messages of earlier deliveries that the release
	// applied, for the observer.
	others []ParkedMessage
}

// orderChain is an entity of a batch and the last sequence fn applies.
type orderChain struct {
	key  string
	last int64
	// parkedMax is the highest sequence parked for key: the row's
	// parked_max, raised by what the batch parked.
	parkedMax int64
}

// orderBatch decides, in tx, after a batch's claims, what the sequence of
// each of its fresh ordered messages means, entity by entity in ascending
// order of ordering keys, so that overlapping batches lock the sequence
// rows in one order, as they take the claims. From an entity's last
// applied sequence, the batch's messages that follow without a gap apply
// in this transaction; one at or below the sequence applied (or given
// twice) is Duplicate and its claim deleted; one further ahead is parked.
// The entity's row moves to the last that applies before fn runs, as
// ordered moves it before a handler. A message whose sequence an operator
// skipped fails the batch with a *BatchKeyError naming it
// (ErrSkippedSequence).
//
// It returns what fn is given: fresh without the ordered messages that do
// not apply, each entity's messages placed in sequence order in the
// positions they hold (the unordered messages keep theirs).
func (m *Middleware) orderBatch(ctx context.Context, tx *sql.Tx, msgs []Message, fresh []int) ([]int, *batchOrder, error) {
	o := m.ord
	byKey := map[string][]int{}
	var apply []int
	for _, i := range fresh {
		if k := msgs[i].OrderKey; k != "" {
			byKey[k] = append(byKey[k], i)
		} else {
			apply = append(apply, i)
		}
	}
	if len(byKey) == 0 {
		return fresh, nil, nil
	}
	bo := &batchOrder{outcome: map[int]Outcome{}, parked: map[string]int{}}
	duplicate := func(i int) error {
		bo.outcome[i] = Duplicate
		if _, err := tx.ExecContext(ctx, o.unclaimSQL, m.consumer, msgs[i].Key); err != nil {
			return fmt.Errorf("idempotent: ordering key %q, sequence %d: delete the claim of duplicate %q: %w", msgs[i].OrderKey, msgs[i].OrderSeq, msgs[i].Key, err)
		}
		return nil
	}
	var entities [][]int // each entity's applying messages, in sequence order
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	// Every row is locked before the parking table is read: on a database
	// whose plain reads see a snapshot taken at the first one (MySQL's
	// repeatable read), a read before a later lock would miss what the
	// holder of that lock parked meanwhile.
	lasts := make([]int64, len(keys))
	maxes := make([]int64, len(keys))
	for j, k := range keys {
		var err error
		if lasts[j], maxes[j], err = o.lock(ctx, tx, m.consumer, k); err != nil {
			return nil, nil, err
		}
	}
	for j, k := range keys {
		idx := byKey[k]
		slices.SortFunc(idx, func(a, b int) int { return cmp.Or(cmp.Compare(msgs[a].OrderSeq, msgs[b].OrderSeq), a-b) })
		last := lasts[j]
		next, ahead := last+1, int64(0)
		var mine []int
		for _, i := range idx {
			seq := msgs[i].OrderSeq
			switch {
			case seq == next:
				mine = append(mine, i)
				next++
			case seq < next:
				if seq <= last {
					state, _, err := o.lookup(ctx, tx, m.consumer, k, seq)
					if err != nil {
						return nil, nil, err
					}
					if state == "S" {
						return nil, nil, &BatchKeyError{Index: i, Err: fmt.Errorf("%w: key %q: ordering key %q, sequence %d was skipped by an operator and its successors applied without it (last applied %d); it is not applied",
							ErrSkippedSequence, msgs[i].Key, k, seq, last)}
					}
				}
				if err := duplicate(i); err != nil {
					return nil, nil, err
				}
			case seq == ahead:
				// Parked already, from this batch.
				if err := duplicate(i); err != nil {
					return nil, nil, err
				}
			default:
				ahead = seq
				state, _, err := o.lookup(ctx, tx, m.consumer, k, seq)
				if err != nil {
					return nil, nil, err
				}
				if state != "" {
					if err := duplicate(i); err != nil {
						return nil, nil, err
					}
					continue
				}
				if err := o.parkLocked(ctx, tx, m.consumer, msgs[i], m.ret.clock()); err != nil {
					return nil, nil, err
				}
				maxes[j] = max(maxes[j], seq)
				bo.outcome[i], bo.parked[msgs[i].Key] = Parked, i
			}
		}
		if len(mine) == 0 {
			continue
		}
		if err := o.bump(ctx, tx, m.consumer, k, next-1); err != nil {
			return nil, nil, err
		}
		bo.chains = append(bo.chains, orderChain{key: k, last: next - 1, parkedMax: maxes[j]})
		entities = append(entities, mine)
		apply = append(apply, mine...)
	}
	slices.Sort(apply)
	pos := make(map[int]int, len(apply)) // batch index → position in apply
	for p, i := range apply {
		pos[i] = p
	}
	out := slices.Clone(apply)
	for _, mine := range entities {
		slots := make([]int, len(mine))
		for j, i := range mine {
			slots[j] = pos[i]
		}
		slices.Sort(slots)
		for j, i := range mine {
			out[slots[j]] = i
		}
	}
	return out, bo, nil
}

// releaseBatch applies, after fn, the parked successors of every entity
// of bo that fn moved on, through Ordering.Release, in this transaction:
// those of earlier deliveries and those the batch itself parked, which are
// then Applied.
func (m *Middleware) releaseBatch(ctx context.Context, tx *sql.Tx, st *attemptState, msgs []Message, bo *batchOrder) error {
	if bo == nil {
		return nil
	}
	for _, c := range bo.chains {
		released, err := m.release(ctx, tx, st, m.ord, c.key, c.last, c.parkedMax, true)
		if err != nil {
			return err
		}
		for _, p := range released {
			if i, ok := bo.parked[p.Key]; ok && msgs[i].OrderKey == p.OrderKey && msgs[i].OrderSeq == p.OrderSeq {
				bo.outcome[i] = Applied
				continue
			}
			bo.others = append(bo.others, p)
		}
	}
	return nil
}

func batchTooLarge(n int) error {
	return fmt.Errorf("%w: %d messages, the limit is %d", ErrBatchTooLarge, n, MaxBatchSize)
}

// batchClaim is what a batch claims: the distinct, ascending keys uniq,
// first[j] the index in the batch of uniq[j]'s first message, ats[j] its
// event time (zero for none) and, in partitioned mode, days = ats.
type batchClaim struct {
	uniq  []string
	first []int
	ats   []time.Time
	days  []time.Time
}

// claimBatch claims b on tx through claimWith, sets isNew[j] when
// uniq[j]'s claim was new, and reports whether any was. Where the dialect
// keeps a horizon, it is read after the claims, in tx, and a new claim older
// than it fails the batch with a BatchKeyError naming its message.
func (m *Middleware) claimBatch(ctx context.Context, tx *sql.Tx, st *attemptState, b batchClaim, isNew []bool) (bool, error) {
	return m.claimWith(ctx, tx, st, func() (bool, error) { return m.batchClaimStatements(ctx, tx, b, isNew) })
}

// batchClaimStatements is the statements of claimBatch: the batch's claim
// and, when it inserted claims with event times, the horizon's read.
func (m *Middleware) batchClaimStatements(ctx context.Context, tx *sql.Tx, b batchClaim, isNew []bool) (bool, error) {
	{
		if err := m.batchStatements(ctx, tx, b, isNew); err != nil {
			return false, err
		}
		if !slices.Contains(isNew, true) {
			return false, nil
		}
		if m.hk != nil {
			var keys []string
			var ats []time.Time
			var idx []int
			for j, ok := range isNew {
				if ok && !b.ats[j].IsZero() {
					keys, ats, idx = append(keys, b.uniq[j]), append(ats, b.ats[j]), append(idx, b.first[j])
				}
			}
			if len(ats) > 0 {
				if i, err := m.checkHorizonAfterClaim(ctx, tx, keys, ats); err != nil {
					if i >= 0 {
						return false, &BatchKeyError{Index: idx[i], Err: err}
					}
					return false, err
				}
			}
		}
		return true, nil
	}
}

// batchStatements runs the batch's claim statement: one for the whole batch
// where the dialect can (dialect.BatchClaimer, or in partitioned mode
// dialect.PartitionedBatchClaimer), else one per key — in partitioned mode
// each with its event day.
func (m *Middleware) batchStatements(ctx context.Context, tx *sql.Tx, b batchClaim, isNew []bool) error {
	uniq, days := b.uniq, b.days
	bc, ok := m.d.(dialect.BatchClaimer)
	var pbc dialect.PartitionedBatchClaimer
	if days != nil {
		pbc, ok = m.d.(dialect.PartitionedBatchClaimer)
	}
	if !ok {
		// One claim statement per key, in ascending order.
		for j, k := range uniq {
			var res sql.Result
			var err error
			if days == nil {
				res, err = tx.ExecContext(ctx, m.claimSQL, m.consumerArg, k)
			} else {
				res, err = tx.ExecContext(ctx, m.claimSQL, m.consumerArg, k, eventDay(days[j]).Format(time.DateOnly))
			}
			if err != nil {
				if days != nil {
					if rerr := m.retentionClaimError(ctx, tx, err, b.first[j:j+1], days[j]); rerr != nil {
						var bke *BatchKeyError
						if errors.As(rerr, &bke) {
							return rerr
						}
						return fmt.Errorf("key %q: %w", k, rerr)
					}
				}
				return fmt.Errorf("key %q: %w", k, m.claimError(err))
			}
			n, err := res.RowsAffected()
			if err != nil {
				return fmt.Errorf("idempotent: claim %q: rows affected: %w", k, err)
			}
			isNew[j] = n == 1
		}
		return nil
	}
	var rows *sql.Rows
	var err error
	if days == nil {
		rows, err = tx.QueryContext(ctx, bc.BatchClaimSQL(m.table), m.consumer, bc.BatchKeysArg(uniq))
	} else {
		ds := make([]string, len(days))
		for j, d := range days {
			ds[j] = eventDay(d).Format(time.DateOnly)
		}
		rows, err = tx.QueryContext(ctx, pbc.PartitionedBatchClaimSQL(m.table), m.consumer, pbc.BatchKeysArg(uniq), pbc.BatchKeysArg(ds))
	}
	if err != nil {
		return m.batchClaimError(ctx, tx, err, b)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return fmt.Errorf("idempotent: batch claim: %w", err)
		}
		j, found := slices.BinarySearch(uniq, k)
		if !found {
			return fmt.Errorf("idempotent: batch claim: the database returned key %q, which is not in the batch", k)
		}
		isNew[j] = true
	}
	if err := rows.Err(); err != nil {
		return m.batchClaimError(ctx, tx, err, b)
	}
	return nil
}

// batchClaimError wraps a failed batch claim statement's error; in
// partitioned mode a missing partition becomes ErrNoPartition naming the
// batch's days (the statement does not say which of them failed), or
// ErrBeyondRetention for the first message of a day the horizon says was
// dropped.
func (m *Middleware) batchClaimError(ctx context.Context, tx *sql.Tx, err error, b batchClaim) error {
	if len(b.days) > 0 {
		if rerr := m.retentionClaimError(ctx, tx, err, b.first, b.days...); rerr != nil {
			return rerr
		}
	}
	return m.claimError(err)
}

// observeBatch tells the observer, if any, one Event per message.
func (m *Middleware) observeBatch(ctx context.Context, msgs []Message, outcomes []Outcome, attempts int, d time.Duration, err error) {
	if m.observer == nil {
		return
	}
	for i, msg := range msgs {
		e := Event{Consumer: m.consumer, Key: msg.Key, Attempts: attempts, Duration: d, Err: err}
		if err == nil {
			e.Outcome = outcomes[i]
		}
		m.observer.Outcome(ctx, e)
	}
}

// WrapMessages turns a handler of decoded messages into a function that
// processes a batch of them exactly once, as ProcessMessages does: h is
// called once per batch with the messages that are new, in their order in
// the batch, and is not called when all are duplicates. msg returns each
// message's Message: its stable, producer-assigned key and, when it has
// one, its event time (required in partitioned mode). If msg fails for any
// message, the returned function fails the whole batch with a
// *BatchKeyError matching ErrInvalidKey that names the message's index,
// before anything is sent.
func WrapMessages[M any](m *Middleware, msg func(M) (Message, error), h BatchHandler[M]) func(ctx context.Context, msgs []M) ([]Outcome, error) {
	return func(ctx context.Context, vs []M) ([]Outcome, error) {
		if len(vs) == 0 {
			return nil, nil
		}
		if msg == nil || h == nil {
			return nil, m.batchFailed(ctx, errors.New("idempotent: WrapMessages: nil message function or handler"))
		}
		msgs, err := messagesOf(ctx, m, msg, vs)
		if err != nil {
			return nil, err
		}
		return m.processObserved(ctx, &m.run, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			return h(ctx, tx, pick(vs, fresh))
		})
	}
}

// messagesOf is the one reading of a batch's Messages by the batch
// wrappers (WrapMessages, WrapMessagesTx): a batch too large, or a failure
// of msg, is told to the observer and fails the whole batch before anything
// is sent, the latter as a *BatchKeyError matching ErrInvalidKey.
func messagesOf[M any](ctx context.Context, m *Middleware, msg func(M) (Message, error), vs []M) ([]Message, error) {
	if len(vs) > MaxBatchSize {
		return nil, m.batchFailed(ctx, batchTooLarge(len(vs)))
	}
	msgs := make([]Message, len(vs))
	for i, v := range vs {
		mm, err := msg(v)
		if err != nil {
			return nil, m.batchFailed(ctx, &BatchKeyError{Index: i, Err: fmt.Errorf("%w: key function: %w", ErrInvalidKey, err)})
		}
		msgs[i] = mm
	}
	return msgs, nil
}

// batchFailed tells the observer, if any, of a batch refused before its
// messages were read, and returns err.
func (m *Middleware) batchFailed(ctx context.Context, err error) error {
	if m.observer != nil {
		m.observer.Outcome(ctx, Event{Consumer: m.consumer, Err: err})
	}
	return err
}

// pick returns the values of vs at the indexes fresh, in their order.
func pick[M any](vs []M, fresh []int) []M {
	sel := make([]M, len(fresh))
	for j, i := range fresh {
		sel[j] = vs[i]
	}
	return sel
}
