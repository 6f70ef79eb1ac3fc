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
)

// BatchFunc applies the effects of a batch's new messages inside the
// transaction that claimed them, as idempotent.BatchFunc does: fresh holds
// the indexes, in the batch given to ProcessBatch, of the messages whose
// claims were new, in ascending order, and is never empty.
type BatchFunc func(ctx context.Context, tx pgx.Tx, fresh []int) error

// ProcessBatch applies the effects of a batch of messages exactly once for
// this consumer, in one transaction, with the semantics of
// idempotent.Middleware.ProcessBatch: one Outcome per key, in order; a key
// repeated in the batch is applied at most once; fn runs once for the new
// messages and not at all when every message is a duplicate.
//
// BEGIN and the batch's claim — one INSERT … SELECT FROM unnest($2::text[])
// with the keys as a native []string, in ascending order so that
// overlapping batches cannot deadlock — travel in one round trip. Bad input
// is refused before anything is sent: more than idempotent.MaxBatchSize keys
// fail with idempotent.ErrBatchTooLarge, an invalid key with an
// *idempotent.BatchKeyError matching idempotent.ErrInvalidKey. Batches are
// refused in partitioned mode, which needs each message's event time. The
// duplicate pre-check (WithSeen) is consulted as by the core's
// ProcessMessages: keys it knows are Duplicate and not claimed, a batch it
// knows whole opens no transaction, and the claimed keys are recorded after
// the commit (in one call where it is an idempotent.SeenBatch).
func (m *Middleware) ProcessBatch(ctx context.Context, keys []string, fn BatchFunc) ([]idempotent.Outcome, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	var start time.Time
	if m.observer != nil {
		start = time.Now()
	}
	outcomes, attempts, err := m.processBatch(ctx, keys, fn)
	if m.observer != nil {
		for i, k := range keys {
			var o idempotent.Outcome
			if err == nil {
				o = outcomes[i]
			}
			m.observe(ctx, k, o, attempts, start, err)
		}
	}
	return outcomes, err
}

func (m *Middleware) processBatch(ctx context.Context, keys []string, fn BatchFunc) ([]idempotent.Outcome, int, error) {
	if fn == nil {
		return nil, 0, errors.New("idempgx: ProcessBatch: nil function")
	}
	if ctx.Value(claimKey{}) != nil {
		return nil, 0, fmt.Errorf("idempgx: consumer %q, batch of %d: %w", m.consumer, len(keys), ErrNested)
	}
	if len(keys) > idempotent.MaxBatchSize {
		return nil, 0, fmt.Errorf("%w: %d messages, the limit is %d", idempotent.ErrBatchTooLarge, len(keys), idempotent.MaxBatchSize)
	}
	if m.partitioned {
		return nil, 0, fmt.Errorf("idempgx: ProcessBatch: the claim table %s is partitioned by event day, and a batch carries no event times: use ProcessEvent per message", m.table)
	}
	for i, k := range keys {
		if err := validateKey(k); err != nil {
			return nil, 0, &idempotent.BatchKeyError{Index: i, Err: err}
		}
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Or(strings.Compare(keys[a], keys[b]), a-b) })
	c := &claimBatch{m: m, uniq: make([]string, 0, len(keys))}
	first := make([]int, 0, len(keys))
	for _, i := range order {
		if n := len(c.uniq); n > 0 && c.uniq[n-1] == keys[i] {
			continue
		}
		c.uniq = append(c.uniq, keys[i])
		first = append(first, i)
	}
	// The pre-check: keys it knows are duplicates, and are not claimed.
	if hit := m.seenKeys(ctx, c.uniq); hit != nil {
		n := 0
		for j := range c.uniq {
			if !hit[j] {
				c.uniq[n], first[n] = c.uniq[j], first[j]
				n++
			}
		}
		c.uniq, first = c.uniq[:n], first[:n]
		if n == 0 {
			outcomes := make([]idempotent.Outcome, len(keys))
			for i := range outcomes {
				outcomes[i] = idempotent.Duplicate
			}
			return outcomes, 0, nil
		}
	}
	c.isNew = make([]bool, len(c.uniq))
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
		return nil, attempts, fmt.Errorf("idempgx: consumer %q, batch of %d: %w", m.consumer, len(keys), err)
	}
	outcomes := make([]idempotent.Outcome, len(keys))
	for i := range outcomes {
		outcomes[i] = idempotent.Duplicate
	}
	for j, ok := range c.isNew {
		if ok {
			outcomes[first[j]] = idempotent.Applied
		}
	}
	m.recordSeenKeys(ctx, c.uniq)
	return outcomes, attempts, nil
}

// seenKeys reports which of keys the pre-check, if any, already knows: nil
// when there is none. A SeenBatch answers in one call.
func (m *Middleware) seenKeys(ctx context.Context, keys []string) []bool {
	if m.seen == nil {
		return nil
	}
	if sb, ok := m.seen.(idempotent.SeenBatch); ok {
		if hit := sb.SeenKeys(ctx, m.consumer, keys); len(hit) == len(keys) {
			return hit
		}
		return make([]bool, len(keys)) // a wrong answer counts as a miss
	}
	hit := make([]bool, len(keys))
	for i, k := range keys {
		hit[i] = m.seen.Seen(ctx, m.consumer, k)
	}
	return hit
}

// recordSeenKeys tells the pre-check, if any, that keys' claims are
// committed.
func (m *Middleware) recordSeenKeys(ctx context.Context, keys []string) {
	if m.seen == nil || len(keys) == 0 {
		return
	}
	if sb, ok := m.seen.(idempotent.SeenBatch); ok {
		sb.RecordKeys(ctx, m.consumer, keys, m.retention)
		return
	}
	for _, k := range keys {
		m.seen.Record(ctx, m.consumer, k, m.retention)
	}
}

// claimBatch is the batch claim step: the distinct keys in ascending order,
// and which of them were new in the current attempt.
type claimBatch struct {
	m     *Middleware
	uniq  []string
	isNew []bool
}

func (c *claimBatch) queue(b *pgx.Batch) { b.Queue(c.m.batchSQL, c.m.consumer, c.uniq) }

func (c *claimBatch) read(br pgx.BatchResults) (bool, error) {
	clear(c.isNew)
	rows, err := br.Query()
	if err != nil {
		return false, c.m.claimError(err, time.Time{})
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
		return false, c.m.claimError(err, time.Time{})
	}
	return any, nil
}
