package dialecttest

import (
	"context"
	"database/sql"
	"slices"
	"testing"

	"github.com/txclaim/idempotent"
)

// checkOrderMixed: a message parked by a batch is released by a single
// ProcessMessage and the other way round; a batch that parks a sequence
// and applies its predecessors in the same transaction releases it.
func checkOrderMixed(t *testing.T, e *Env) {
	ctx, _, _, a, mw := orderSetup(t, e)
	A, D, P := idempotent.Applied, idempotent.Duplicate, idempotent.Parked
	batch := func(msgs ...idempotent.Message) []idempotent.Outcome {
		t.Helper()
		outs, err := mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			for _, i := range fresh {
				if err := a.record(ctx, tx, msgs[i].OrderKey, msgs[i].OrderSeq); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return outs
	}
	single := func(seq int64, want idempotent.Outcome) {
		t.Helper()
		if out, err := a.process(ctx, mw, orderedMessage("m", seq)); err != nil || out != want {
			t.Fatalf("m%d alone: %v, %v; want %v", seq, out, err, want)
		}
	}
	for s := int64(1); s <= 4; s++ {
		single(s, A)
	}
	// The batch parks 7 and 9; single messages release them.
	if outs := batch(orderedMessage("m", 7), orderedMessage("m", 9)); !slices.Equal(outs, []idempotent.Outcome{P, P}) {
		t.Fatalf("batch 7, 9: %v; want both Parked", outs)
	}
	single(5, A)
	single(6, A)
	wantOrder(t, a, "m", 1, 2, 3, 4, 5, 6, 7)
	single(8, A)
	wantOrder(t, a, "m", seqs(1, 9)...)
	// A single message parks 12; a batch applies 10 and 11 and releases it.
	single(12, P)
	if outs := batch(orderedMessage("m", 11), orderedMessage("m", 10)); !slices.Equal(outs, []idempotent.Outcome{A, A}) {
		t.Fatalf("batch 11, 10: %v; want both Applied", outs)
	}
	wantOrder(t, a, "m", seqs(1, 12)...)
	// 14 parked alone; a batch of 13, 15 (parked by it, then released)
	// and 16 ahead of a gap.
	single(14, P)
	if outs := batch(orderedMessage("m", 15), orderedMessage("m", 13), orderedMessage("m", 17), orderedMessage("m", 14)); !slices.Equal(outs, []idempotent.Outcome{A, A, P, D}) {
		t.Fatalf("batch 15, 13, 17, 14: %v; want A A P D", outs)
	}
	wantOrder(t, a, "m", seqs(1, 15)...)
	single(16, A)
	wantOrder(t, a, "m", seqs(1, 17)...)
	if waiting, err := mw.Waiting(ctx); err != nil || len(waiting) != 0 {
		t.Errorf("Waiting: %+v, %v; want nothing parked", waiting, err)
	}
}

// checkOrderTableSkipResend: after an operator's ClaimTable.SkipGap (the
// CLI's "order skip", which applies nothing), the parked message that is
// next comes again under another message key, alone or in a batch: its
// sequence applies once, and the parked copy left below the last applied
// sequence is deleted by CheckGaps, its claim kept.
func checkOrderTableSkipResend(t *testing.T, e *Env) {
	ctx, _, _, a, mw := orderSetup(t, e)
	A, P := idempotent.Applied, idempotent.Parked
	for _, batched := range []bool{false, true} {
		k := "s"
		if batched {
			k = "sb"
		}
		for seq, want := range map[int64]idempotent.Outcome{1: A, 3: P, 4: P} {
			if out, err := a.process(ctx, mw, orderedMessage(k, seq)); err != nil || out != want {
				t.Fatalf("%s%d: %v, %v; want %v", k, seq, out, err, want)
			}
		}
		if _, err := mw.ClaimTable().SkipGap(ctx, "ordered", k, 2); err != nil {
			t.Fatal(err)
		}
		again := orderedMessage(k, 3)
		again.Key += "-resent"
		var err error
		if batched {
			_, err = a.processBatch(ctx, mw, []idempotent.Message{again, {Key: k + "-x"}})
		} else {
			_, err = a.process(ctx, mw, again)
		}
		if err != nil {
			t.Fatal(err)
		}
		wantOrder(t, a, k, 1, 3, 4)
		// The parked copy of 3 stays below the last applied sequence
		// until CheckGaps deletes it: the delivery's path touches
		// nothing for it.
		stale := func() *idempotent.Gap {
			waiting, err := mw.Waiting(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range waiting {
				if g.OrderKey == k {
					return &g
				}
			}
			return nil
		}
		if g := stale(); g == nil || g.NextParked != 3 || g.LastSeq != 4 || g.Parked != 1 {
			t.Errorf("after the re-send of %s3: %+v; want the stale copy of 3 below 4", k, g)
		}
		// CheckGaps deletes it, and finds nothing to release or report.
		if gaps, err := mw.CheckGaps(ctx); err != nil || len(gaps) != 0 {
			t.Errorf("CheckGaps: %+v, %v; want nothing", gaps, err)
		}
		if g := stale(); g != nil {
			t.Errorf("left parked after CheckGaps: %+v", g)
		}
		// The copy's claim stays: its redelivery is Duplicate.
		if out, err := a.process(ctx, mw, orderedMessage(k, 3)); err != nil || out != idempotent.Duplicate {
			t.Errorf("redelivered %s3: %v, %v; want Duplicate", k, out, err)
		}
		wantOrder(t, a, k, 1, 3, 4)
	}
}
