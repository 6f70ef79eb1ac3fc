package dialecttest

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"

	"github.com/txclaim/idempotent"
)

// checkOrderBatch: ProcessMessages with ordered messages. Within a batch,
// each entity's messages that are next apply through the batch function,
// in sequence order whatever their order in the batch; its parked
// successors (parked earlier, or by this batch) then apply through
// Release, in the same transaction; one ahead of a gap parks; a sequence
// given twice is Duplicate and leaves no claim; a skipped one fails the
// batch with a BatchKeyError naming it.
func checkOrderBatch(t *testing.T, e *Env) {
	ctx, db, table, a, mw := orderSetup(t, e)
	if out, err := a.process(ctx, mw, orderedMessage("a", 2)); err != nil || out != idempotent.Parked {
		t.Fatalf("a2 alone: %v, %v; want Parked", out, err)
	}
	a5bis := orderedMessage("a", 5)
	a5bis.Key = "a-5-resent"
	batch := []idempotent.Message{
		orderedMessage("b", 2), orderedMessage("a", 3), orderedMessage("a", 1), orderedMessage("b", 1),
		{Key: "x"}, orderedMessage("a", 5), a5bis, orderedMessage("b", 4),
	}
	var given []int
	run := func(msgs []idempotent.Message) ([]idempotent.Outcome, error) {
		return mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			given = slices.Clone(fresh)
			for _, i := range fresh {
				if msgs[i].OrderKey == "" {
					continue
				}
				if err := a.record(ctx, tx, msgs[i].OrderKey, msgs[i].OrderSeq); err != nil {
					return err
				}
			}
			return nil
		})
	}
	outs, err := run(batch)
	if err != nil {
		t.Fatal(err)
	}
	A, D, P := idempotent.Applied, idempotent.Duplicate, idempotent.Parked
	if want := []idempotent.Outcome{A, A, A, A, A, P, D, P}; !slices.Equal(outs, want) {
		t.Errorf("outcomes %v, want %v", outs, want)
	}
	// b1 (index 3) takes the first place of b's, b2 (index 0) the second.
	if want := []int{3, 2, 0, 4}; !slices.Equal(given, want) {
		t.Errorf("the batch function was given %v, want %v", given, want)
	}
	wantOrder(t, a, "a", 1, 2, 3)
	wantOrder(t, a, "b", 1, 2)

	resent := orderedMessage("a", 2)
	resent.Key = "a-2-resent"
	outs, err = run([]idempotent.Message{orderedMessage("a", 4), orderedMessage("b", 1), resent})
	if err != nil {
		t.Fatal(err)
	}
	if want := []idempotent.Outcome{A, D, D}; !slices.Equal(outs, want) {
		t.Errorf("second batch: outcomes %v, want %v", outs, want)
	}
	wantOrder(t, a, "a", 1, 2, 3, 4, 5)
	claims := e.Claims(t, db, table)
	for _, k := range []string{"a-2-resent", "a-5-resent"} {
		if slices.Contains(claims, k) {
			t.Errorf("the claim of %s, a duplicate of an applied or parked sequence, was kept", k)
		}
	}

	if n, err := mw.SkipGap(ctx, "b", 3); err != nil || n != 1 {
		t.Fatalf("SkipGap b 3: %d, %v; want b4 released", n, err)
	}
	wantOrder(t, a, "b", 1, 2, 4)
	_, err = run([]idempotent.Message{{Key: "y"}, orderedMessage("b", 3)})
	var bke *idempotent.BatchKeyError
	if !errors.Is(err, idempotent.ErrSkippedSequence) || !errors.As(err, &bke) || bke.Index != 1 {
		t.Errorf("a batch with a skipped sequence: %v; want a BatchKeyError at 1 matching ErrSkippedSequence", err)
	}
	if slices.Contains(e.Claims(t, db, table), "y") {
		t.Errorf("the refused batch's claim of y was committed")
	}
	if waiting, err := mw.Waiting(ctx); err != nil || len(waiting) != 0 {
		t.Errorf("Waiting: %+v, %v; want nothing parked", waiting, err)
	}
}
