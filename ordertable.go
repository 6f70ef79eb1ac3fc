package idempotent

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

// The operator's side of ordered mode on a ClaimTable: what the idempotent
// CLI's "order gaps" and "order skip" run, apart from any consumer's
// process (see docs/ordering.md and docs/operations.md).

// Skipped is what ClaimTable.SkipGap did to one entity.
type Skipped struct {
	// Consumer and OrderKey name the entity.
	Consumer, OrderKey string
	// From and To are the first and last sequence marked skipped; the
	// entity's last applied sequence is now To.
	From, To int64
	// Next is how many parked messages follow To without a gap: they are
	// next now, and the consumer's CheckGaps applies them, in order,
	// through its Ordering.Release.
	Next int
	// Parked is how many messages of the entity are parked, Next
	// included.
	Parked int
}

// orderer returns the table's ordering statements, or an error naming the
// dialect when it keeps no order.
func (t *ClaimTable) orderer(op string) (*orderer, error) {
	o, err := newOrderer(t.d, t.table, &Ordering{})
	if err != nil {
		return nil, fmt.Errorf("idempotent: %s: the %s dialect cannot keep messages in order (it is no dialect.Orderer)", op, t.d.Name())
	}
	return o, nil
}

// SkipGap is Middleware.SkipGap for an operator outside the consumer's
// process, who has no Ordering.Release: in one transaction, under the
// entity's lock, it marks every sequence of consumer's orderKey after the
// last applied, up to and including seq, as skipped and makes seq the last
// applied, but applies nothing. The parked messages that are next then are
// applied by the consumer's next CheckGaps, in order, in transactions of
// their own; until then they stay parked, and a late message of a skipped
// sequence is refused with ErrSkippedSequence as after Middleware.SkipGap.
//
// It refuses, changing nothing, what Middleware.SkipGap refuses (seq not
// ahead of the last applied, more than MaxSkip sequences, a parked
// sequence at or below seq), and an entity the consumer has never seen (no
// sequence row and nothing parked: a mistyped consumer or key).
func (t *ClaimTable) SkipGap(ctx context.Context, consumer, orderKey string, seq int64) (Skipped, error) {
	o, err := t.orderer("SkipGap")
	if err != nil {
		return Skipped{}, err
	}
	if err := validateConsumer(consumer); err != nil {
		return Skipped{}, fmt.Errorf("idempotent: SkipGap: %w", err)
	}
	if err := validateOrder(orderKey, seq, o.maxKey); err != nil {
		return Skipped{}, fmt.Errorf("idempotent: SkipGap: consumer %q: %w", consumer, err)
	}
	var res Skipped
	r := runner{db: t.db, d: t.d, policy: t.policy}
	_, err = r.run(ctx, orderKey, func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
		last, _, parked, err := o.skip(ctx, tx, consumer, orderKey, seq, t.now())
		if err != nil {
			return err
		}
		if last == 0 && len(parked) == 0 {
			return fmt.Errorf("%w: SkipGap: consumer %q has no ordering key %q (nothing applied, nothing parked); nothing to skip",
				ErrInvalidOrder, consumer, orderKey)
		}
		if err := o.bump(ctx, tx, consumer, orderKey, seq); err != nil {
			return err
		}
		res = Skipped{Consumer: consumer, OrderKey: orderKey, From: last + 1, To: seq, Parked: len(parked)}
		for _, p := range parked {
			if p.OrderSeq != seq+int64(res.Next)+1 {
				break
			}
			res.Next++
		}
		return nil
	})
	if err != nil {
		// The errors of skip name the ordering key; this adds the consumer.
		return Skipped{}, fmt.Errorf("%w (consumer %q)", t.orderTableError(o, err), consumer)
	}
	return res, nil
}

// Waiting is Middleware.Waiting for an operator: every entity of consumer
// with parked messages, with its last applied sequence, lowest parked
// sequence, count and oldest park, whatever its age. A gap is one whose
// NextParked is above LastSeq+1; one whose NextParked is LastSeq+1 waits
// for the consumer's CheckGaps (after a ClaimTable.SkipGap), and so does
// one whose NextParked is at or below LastSeq: a stale copy of a sequence
// that a re-send under another message key applied after such a skip,
// which CheckGaps deletes.
func (t *ClaimTable) Waiting(ctx context.Context, consumer string) ([]Gap, error) {
	o, err := t.orderer("Waiting")
	if err != nil {
		return nil, err
	}
	if err := validateConsumer(consumer); err != nil {
		return nil, fmt.Errorf("idempotent: Waiting: %w", err)
	}
	gaps, err := o.waiting(ctx, t.db, consumer)
	if err != nil {
		return nil, t.orderTableError(o, err)
	}
	return gaps, nil
}

// orderTableError turns an undefined-table failure into ErrNoClaimTable
// naming the ordering tables.
func (t *ClaimTable) orderTableError(o *orderer, err error) error {
	if err != nil && t.d.Classify(err).Kind == dialect.KindUndefinedTable {
		return fmt.Errorf("%w: the ordering tables %s and %s of %s (run EnsureSchema of a Middleware created WithOrdering): %w",
			ErrNoClaimTable, o.seqTable, o.parkTable, t.table, err)
	}
	return err
}
