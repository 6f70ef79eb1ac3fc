package kafka

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
)

// Ordered records (docs/ordering.md). A record that carries an ordering key
// and a sequence (adapter.OrderKeyHeader, adapter.OrderSeqHeader), read by
// a Consumer whose Middleware was created idempotent.WithOrdering, is not
// claimed on the Middleware's delivery path (adapter.Path, which keeps no
// per-key order) but by the Middleware's own ordered step — the claim, the
// entity's sequence row, the handler or the park, the release of parked
// successors — in a transaction whose first statement is the partition's
// offset advance. A record that applies, or parks, commits with its offset,
// as an unordered record does. One that is a duplicate (its claim found, its
// sequence at or below the entity's last applied) has its transaction
// rolled back by the Middleware; its offset then advances in a transaction
// of its own, in which nothing else is written: a crash between the two
// reads the record again, and it is a duplicate again.

// ParkedRecord rebuilds the record of a message that was parked because
// it arrived before its predecessor (idempotent.WithOrdering, see
// docs/ordering.md), for an idempotent.Ordering.Release that runs the
// Consumer's handler: its Value and its Headers, sorted by key (a header
// that the record carried more than once keeps its last value). Its
// topic, partition, offset, key and timestamp are not kept: they are
// zero (the parked message's EventTime is the event time it was read
// with, its Key the idempotency key).
func ParkedRecord(p idempotent.ParkedMessage) *kgo.Record {
	r := &kgo.Record{Value: p.Payload}
	for _, k := range slices.Sorted(maps.Keys(p.Headers)) {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(p.Headers[k])})
	}
	return r
}

// offsetFirst returns the BeginFunc of an ordered step's transaction:
// begin it on db, then run companion (the offset advance, and what
// commits with it) as its first statements. A companion that fails rolls
// the transaction back and fails the attempt with its error (a
// *fenceError, a *LogGapError, or the database's, which the Middleware
// classifies and retries as any other).
func offsetFirst(companion func(ctx context.Context, tx *sql.Tx) error) idempotent.BeginFunc[*sql.Tx] {
	return func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, *sql.Tx, error) {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		if err := companion(ctx, tx); err != nil {
			_ = tx.Rollback()
			return nil, nil, err
		}
		return tx, tx, nil
	}
}

// orderedRecord applies r, an ordered record at the stored offset expected,
// with the Middleware's ordered step, its offset advance (storing topicID)
// first in the transaction, and handle as the handler. It returns the
// Middleware's outcome: Applied, Parked (acknowledged: its offset moved, it
// waits in the parking table for its predecessor) or Duplicate.
func (c *Consumer) orderedRecord(ctx context.Context, r *kgo.Record, msg idempotent.Message, expected int64, topicID string, handle idempotent.TxFunc) (idempotent.Outcome, error) {
	advance := func(ctx context.Context, tx *sql.Tx) error {
		return c.advanceOffset(ctx, tx, r.Topic, r.Partition, expected, r.Offset+1, topicID)
	}
	if c.co != nil {
		// Run alone, outside the coalesced groups: none waits for it.
		back := c.away()
		defer back()
	}
	out, err := idempotent.ProcessMessageTx(ctx, c.mw, msg, offsetFirst(advance), handle)
	if err != nil || out != idempotent.Duplicate {
		return out, err
	}
	// A duplicate's transaction was rolled back (or never begun: the
	// duplicate pre-check knew its key).
	return out, c.path.Tx(ctx, advance)
}

// orderedBatch is ProcessBatch for a batch that holds ordered records:
// msgs, read from good, claimed and checked by the Middleware's ordered
// step, with companion (the chunk's offset advance to next, and its dead
// letters) first in the transaction and the batch handler given the
// records that apply, in the order the Middleware gives them (each
// entity's in sequence order); sel is set to them, for an
// *adapter.ItemError's index. It reports, per message, whether it was
// acknowledged without being a duplicate (applied, or parked to wait for
// its predecessor).
func (c *Consumer) orderedBatch(ctx context.Context, msgs []idempotent.Message, good []*kgo.Record, next int64, companion func(ctx context.Context, tx *sql.Tx) error, sel *[]*kgo.Record) ([]bool, error) {
	outs, err := idempotent.ProcessMessagesTx(ctx, c.mw, msgs, offsetFirst(companion), func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		recs := make([]*kgo.Record, len(fresh))
		for j, i := range fresh {
			recs[j] = good[i]
		}
		*sel = recs
		return c.batch(ctx, tx, recs)
	})
	if err != nil {
		return nil, err
	}
	acked := make([]bool, len(outs))
	committed := false
	for i, o := range outs {
		acked[i] = o != idempotent.Duplicate
		committed = committed || acked[i]
	}
	if committed {
		return acked, nil
	}
	// Every message was a duplicate. The transaction committed (with the
	// companion) when some claims were new and the sequence rows made
	// them duplicates; it was rolled back, or never begun, otherwise.
	// The stored offset tells which.
	err = c.path.Tx(ctx, companion)
	var fe *fenceError
	if errors.As(err, &fe) && fe.stored == next {
		err = nil
	}
	return acked, err
}
