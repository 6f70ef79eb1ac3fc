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
)

// MaxBatchSize is the most messages ProcessBatch and WrapBatch accept in one
// call. It keeps one batch's claim statement, its locks and its transaction
// short; split larger batches.
const MaxBatchSize = 1000

// ErrBatchTooLarge reports a batch of more than MaxBatchSize messages.
// Nothing was sent to the database.
var ErrBatchTooLarge = errors.New("idempotent: batch too large")

// BatchKeyError reports the message of a batch whose key is invalid. The
// whole batch was refused and nothing was written. Err matches
// ErrInvalidKey, so errors.Is(err, ErrInvalidKey) holds for a BatchKeyError;
// use errors.As to learn which message to set aside.
type BatchKeyError struct {
	// Index is the message's index in the batch.
	Index int
	// Err says what is wrong with its key.
	Err error
}

// Error describes the failure.
func (e *BatchKeyError) Error() string {
	return fmt.Sprintf("idempotent: batch message %d: %v", e.Index, e.Err)
}

// Unwrap returns the key's error.
func (e *BatchKeyError) Unwrap() error { return e.Err }

// BatchFunc applies the effects of a batch's new messages inside the
// transaction that claimed them. fresh holds the indexes, in the batch given
// to ProcessBatch, of the messages whose claims were new, in ascending order;
// it is never empty. Like TxFunc, it must do all its work through tx, with
// ctx, and must not commit or roll back tx. It may run more than once if the
// batch is retried, each time with a fresh slice.
type BatchFunc func(ctx context.Context, tx *sql.Tx, fresh []int) error

// BatchHandler applies the effects of a batch's new messages, given in their
// order in the batch, inside the transaction that claimed them. A handler
// that locks rows should touch them in a stable order (sorted by primary key,
// say) so that concurrent batches cannot deadlock; deadlocks are retried, but
// they cost a whole batch.
type BatchHandler[M any] func(ctx context.Context, tx *sql.Tx, msgs []M) error

// ProcessBatch applies the effects of a batch of messages exactly once for
// this consumer, in one transaction: it claims every key, runs fn once for
// the messages whose claims were new, and commits claims and effects
// together. It returns one Outcome per key, in the order of keys: Applied for
// a message whose effect fn applied, Duplicate for one claimed before. A key
// that occurs more than once in the batch is applied once: its first
// occurrence may be Applied, the later ones are Duplicate. If every message
// is a duplicate, fn does not run and nothing is committed.
//
// The claims are taken in ascending byte order of their keys, so two
// overlapping batches wait for each other instead of deadlocking on their
// claims. With a dialect that implements dialect.BatchClaimer (the Postgres
// one does) the whole batch is claimed by one statement; otherwise each key
// is claimed by its own statement, in the same order and transaction.
//
// Bad input is refused before anything is sent: an empty batch returns
// (nil, nil) at once, a batch of more than MaxBatchSize keys fails with
// ErrBatchTooLarge, and an invalid key fails the whole batch with
// ErrInvalidKey and naming its index (a *BatchKeyError).
//
// Failures are handled as by Process, for the batch as a whole: an error from
// fn rolls back every claim and effect of the batch; serialization failures,
// deadlocks and lost connections retry the whole batch under the retry
// policy. An Observer is told one Event per message, each carrying the
// batch's attempts and duration; retries are reported with an empty Key.
func (m *Middleware) ProcessBatch(ctx context.Context, keys []string, fn BatchFunc) ([]Outcome, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	start := time.Now()
	outcomes, attempts, err := m.processBatch(ctx, keys, fn)
	m.observeBatch(ctx, keys, outcomes, attempts, time.Since(start), err)
	return outcomes, err
}

func (m *Middleware) processBatch(ctx context.Context, keys []string, fn BatchFunc) ([]Outcome, int, error) {
	if fn == nil {
		return nil, 0, errors.New("idempotent: ProcessBatch: nil function")
	}
	if len(keys) > MaxBatchSize {
		return nil, 0, batchTooLarge(len(keys))
	}
	if m.ret.part != nil {
		return nil, 0, fmt.Errorf("idempotent: ProcessBatch: the claim table %s is partitioned by event day, and a batch carries no event times: use ProcessEvent per message", m.table)
	}
	for i, k := range keys {
		if err := validateKey(k, m.maxKey); err != nil {
			return nil, 0, &BatchKeyError{Index: i, Err: err}
		}
	}
	// uniq holds the distinct keys in ascending order, first[j] the index
	// of uniq[j]'s first occurrence in keys.
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Or(strings.Compare(keys[a], keys[b]), a-b) })
	uniq := make([]string, 0, len(keys))
	first := make([]int, 0, len(keys))
	for _, i := range order {
		if n := len(uniq); n > 0 && uniq[n-1] == keys[i] {
			continue
		}
		uniq = append(uniq, keys[i])
		first = append(first, i)
	}

	outcomes := make([]Outcome, len(keys))
	isNew := make([]bool, len(uniq))
	attempts, err := m.run.run(ctx, "", func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
		clear(isNew)
		claimed, err := m.claimBatch(ctx, tx, st, uniq, isNew)
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
		st.inHandler = true
		return fn(ctx, tx, fresh)
	})
	if err != nil {
		return nil, attempts, fmt.Errorf("idempotent: consumer %q, batch of %d: %w", m.consumer, len(keys), err)
	}
	for i := range outcomes {
		outcomes[i] = Duplicate
	}
	for j, ok := range isNew {
		if ok {
			outcomes[first[j]] = Applied
		}
	}
	return outcomes, attempts, nil
}

func batchTooLarge(n int) error {
	return fmt.Errorf("%w: %d messages, the limit is %d", ErrBatchTooLarge, n, MaxBatchSize)
}

// claimBatch claims the distinct, ascending keys uniq on tx through
// claimWith, sets isNew[j] when uniq[j]'s claim was new, and reports whether
// any was.
func (m *Middleware) claimBatch(ctx context.Context, tx *sql.Tx, st *attemptState, uniq []string, isNew []bool) (bool, error) {
	return m.claimWith(ctx, tx, st, func() (bool, error) {
		if err := m.batchStatements(ctx, tx, uniq, isNew); err != nil {
			return false, err
		}
		return slices.Contains(isNew, true), nil
	})
}

// batchStatements runs the batch's claim statement (or one per key).
func (m *Middleware) batchStatements(ctx context.Context, tx *sql.Tx, uniq []string, isNew []bool) error {
	bc, ok := m.d.(dialect.BatchClaimer)
	if !ok {
		// One claim statement per key, in ascending order.
		for j, k := range uniq {
			res, err := tx.ExecContext(ctx, m.claimSQL, m.consumerArg, k)
			if err != nil {
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
	rows, err := tx.QueryContext(ctx, bc.BatchClaimSQL(m.table), m.consumer, bc.BatchKeysArg(uniq))
	if err != nil {
		return m.claimError(err)
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
		return m.claimError(err)
	}
	return nil
}

// observeBatch tells the observer, if any, one Event per message.
func (m *Middleware) observeBatch(ctx context.Context, keys []string, outcomes []Outcome, attempts int, d time.Duration, err error) {
	if m.observer == nil {
		return
	}
	for i, k := range keys {
		e := Event{Consumer: m.consumer, Key: k, Attempts: attempts, Duration: d, Err: err}
		if err == nil {
			e.Outcome = outcomes[i]
		}
		m.observer.Outcome(ctx, e)
	}
}

// WrapBatch turns a handler of decoded messages into a function that
// processes a batch of them exactly once, as ProcessBatch does: h is called
// once per batch with the messages that are new, in their order in the
// batch, and is not called when all are duplicates. key returns each
// message's stable, producer-assigned identity (see Wrap). If key fails for
// any message, the returned function fails the whole batch with an error
// matching ErrInvalidKey that names the message's index, before anything is
// sent.
func WrapBatch[M any](m *Middleware, key func(M) (string, error), h BatchHandler[M]) func(ctx context.Context, msgs []M) ([]Outcome, error) {
	return func(ctx context.Context, msgs []M) ([]Outcome, error) {
		if len(msgs) == 0 {
			return nil, nil
		}
		fail := func(err error) ([]Outcome, error) {
			if m.observer != nil {
				m.observer.Outcome(ctx, Event{Consumer: m.consumer, Err: err})
			}
			return nil, err
		}
		if key == nil || h == nil {
			return fail(errors.New("idempotent: WrapBatch: nil key function or handler"))
		}
		if len(msgs) > MaxBatchSize {
			return fail(batchTooLarge(len(msgs)))
		}
		keys := make([]string, len(msgs))
		for i, msg := range msgs {
			k, err := key(msg)
			if err != nil {
				return fail(&BatchKeyError{Index: i, Err: fmt.Errorf("%w: key function: %w", ErrInvalidKey, err)})
			}
			keys[i] = k
		}
		return m.ProcessBatch(ctx, keys, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			sel := make([]M, len(fresh))
			for j, i := range fresh {
				sel[j] = msgs[i]
			}
			return h(ctx, tx, sel)
		})
	}
}
