package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// The ordered scenarios of dialecttest's Optional/Orderer checks, on the
// pgx path. Each effect appends (entity, seq, pos) to an audit table, pos
// one more than the entity's rows before it, in the effect's transaction.

type pgxAudit struct {
	p    *pgxpool.Pool
	name string
}

func (a *pgxAudit) record(ctx context.Context, tx pgx.Tx, entity string, seq int64) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+a.name+" (entity, seq, pos) SELECT $1::text, $2::bigint, count(*) + 1 FROM "+a.name+" WHERE entity = $1::text", entity, seq)
	return err
}

func (a *pgxAudit) applied(t *testing.T, entity string) []int64 {
	t.Helper()
	rows, err := a.p.Query(context.Background(), "SELECT seq, pos FROM "+a.name+" WHERE entity = $1 ORDER BY pos, seq", entity)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	var lastPos int64
	for rows.Next() {
		var seq, pos int64
		if err := rows.Scan(&seq, &pos); err != nil {
			t.Fatal(err)
		}
		if pos == lastPos {
			t.Errorf("entity %s: two effects applied at position %d", entity, pos)
		}
		lastPos = pos
		out = append(out, seq)
	}
	return out
}

func (a *pgxAudit) process(ctx context.Context, m *idempgx.Middleware, msg idempotent.Message) (idempotent.Outcome, error) {
	return m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error { return a.record(ctx, tx, msg.OrderKey, msg.OrderSeq) })
}

// orderedSetup returns an audit table and a Middleware WithOrdering whose
// Release records into it.
func orderedSetup(t *testing.T, maxConns int32) (*pgxpool.Pool, string, *pgxAudit, *idempgx.Middleware) {
	t.Helper()
	p := newPool(t, maxConns)
	s := tempSchema(t, p)
	a := &pgxAudit{p: p, name: s + ".audit"}
	exec(t, p, "CREATE TABLE "+a.name+" (entity text NOT NULL, seq bigint NOT NULL, pos bigint NOT NULL)")
	m, err := idempgx.New(p, "ledger", idempgx.WithTable(s+".claims"), idempgx.WithOrdering(idempgx.Ordering{
		Release: func(ctx context.Context, tx pgx.Tx, pm idempotent.ParkedMessage) error {
			if want := fmt.Sprintf("%s/%d", pm.OrderKey, pm.OrderSeq); string(pm.Payload) != want {
				return fmt.Errorf("parked payload %q, want %q", pm.Payload, want)
			}
			return a.record(ctx, tx, pm.OrderKey, pm.OrderSeq)
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p, s, a, m
}

func ordMsg(entity string, seq int64) idempotent.Message {
	return idempotent.Message{Key: fmt.Sprintf("%s-%d", entity, seq), OrderKey: entity, OrderSeq: seq, Payload: fmt.Appendf(nil, "%s/%d", entity, seq)}
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

// TestOrderedShuffled: 60 entities × 12 sequences, shuffled, a third sent
// twice, on 6 workers: every entity's effects applied once each, in
// sequence order, nothing left parked.
func TestOrderedShuffled(t *testing.T) {
	p, s, a, m := orderedSetup(t, 8)
	ctx := context.Background()
	const entities, perEntity = 60, 12
	var msgs []idempotent.Message
	for e := range entities {
		for q := int64(1); q <= perEntity; q++ {
			msgs = append(msgs, ordMsg(fmt.Sprintf("e%d", e), q))
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range len(msgs) / 3 {
		msgs = append(msgs, msgs[i*3])
	}
	r.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	work := make(chan idempotent.Message)
	counts := map[idempotent.Outcome]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for msg := range work {
				out, err := a.process(ctx, m, msg)
				if err != nil {
					t.Errorf("%s: %v", msg.Key, err)
				}
				mu.Lock()
				counts[out]++
				mu.Unlock()
			}
		})
	}
	for _, msg := range msgs {
		work <- msg
	}
	close(work)
	wg.Wait()
	t.Logf("%d deliveries: %d applied, %d parked, %d duplicate", len(msgs), counts[idempotent.Applied], counts[idempotent.Parked], counts[idempotent.Duplicate])
	for e := range entities {
		entity := fmt.Sprintf("e%d", e)
		if got := a.applied(t, entity); !slices.Equal(got, seqRange(1, perEntity)) {
			t.Errorf("entity %s applied %v, want 1..%d in order", entity, got, perEntity)
		}
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims_order_parked"); n != 0 {
		t.Errorf("%d messages left parked", n)
	}
	if counts[idempotent.Parked] == 0 {
		t.Errorf("no message parked: the shuffle tested nothing")
	}
}

// TestOrderedParkReleaseDuplicate: a message ahead parks, its redelivery
// is a duplicate of the parked one, a second message of the same sequence
// is a duplicate, the predecessor releases it in its transaction, and a
// replay of either is a duplicate, also once its claim is gone.
func TestOrderedParkReleaseDuplicate(t *testing.T) {
	p, s, a, m := orderedSetup(t, 2)
	ctx := context.Background()
	want := func(msg idempotent.Message, o idempotent.Outcome) {
		t.Helper()
		got, err := a.process(ctx, m, msg)
		if err != nil || got != o {
			t.Fatalf("%s: %v, %v; want %v", msg.Key, got, err, o)
		}
	}
	want(ordMsg("acct", 3), idempotent.Parked)
	want(ordMsg("acct", 2), idempotent.Parked)
	want(ordMsg("acct", 3), idempotent.Duplicate) // the redelivery
	other := ordMsg("acct", 3)
	other.Key = "acct-3-copy"
	want(other, idempotent.Duplicate) // the same sequence, parked already
	if got := a.applied(t, "acct"); len(got) != 0 {
		t.Fatalf("applied %v before the predecessor", got)
	}
	want(ordMsg("acct", 1), idempotent.Applied)
	if got := a.applied(t, "acct"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("applied %v, want 1 2 3", got)
	}
	want(ordMsg("acct", 4), idempotent.Applied)
	exec(t, p, "DELETE FROM "+s+".claims")
	want(ordMsg("acct", 2), idempotent.Duplicate) // its claim cleaned up
	want(ordMsg("acct", 4), idempotent.Duplicate) // the last applied, its claim cleaned up
	if got := a.applied(t, "acct"); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("applied %v, want 1..4", got)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims_order_parked"); n != 0 {
		t.Errorf("%d messages left parked", n)
	}
}

// TestOrderedGapSkip: 5 never arrives, 6–8 park, Waiting reports the gap,
// SkipGap applies 6–8 in order, a late 5 is refused with
// ErrSkippedSequence and nothing is applied.
func TestOrderedGapSkip(t *testing.T) {
	_, _, a, m := orderedSetup(t, 2)
	ctx := context.Background()
	for _, q := range []int64{1, 2, 3, 4, 7, 6, 8} {
		if _, err := a.process(ctx, m, ordMsg("g", q)); err != nil {
			t.Fatal(err)
		}
	}
	gaps, err := m.Waiting(ctx)
	if err != nil || len(gaps) != 1 || gaps[0].LastSeq != 4 || gaps[0].NextParked != 6 || gaps[0].Parked != 3 {
		t.Fatalf("Waiting: %+v, %v; want one gap after 4, 6..8 parked", gaps, err)
	}
	if _, err := m.SkipGap(ctx, "g", 6); !errors.Is(err, idempotent.ErrInvalidOrder) {
		t.Fatalf("SkipGap past a parked sequence: %v, want ErrInvalidOrder", err)
	}
	n, err := m.SkipGap(ctx, "g", 5)
	if err != nil || n != 3 {
		t.Fatalf("SkipGap: %d, %v; want 3 released", n, err)
	}
	if got := a.applied(t, "g"); !slices.Equal(got, []int64{1, 2, 3, 4, 6, 7, 8}) {
		t.Fatalf("applied %v, want 1..4 6..8", got)
	}
	if _, err := a.process(ctx, m, ordMsg("g", 5)); !errors.Is(err, idempotent.ErrSkippedSequence) {
		t.Fatalf("late 5: %v, want ErrSkippedSequence", err)
	}
	if got := a.applied(t, "g"); len(got) != 7 {
		t.Fatalf("applied %v after the late 5", got)
	}
	if _, err := m.SkipGap(ctx, "g", 8); !errors.Is(err, idempotent.ErrInvalidOrder) {
		t.Fatalf("SkipGap behind the last applied: %v, want ErrInvalidOrder", err)
	}
}

// TestOrderedReleaseFails: a Release that fails fails its predecessor's
// delivery, and nothing of it commits: the redelivery applies both.
func TestOrderedReleaseFails(t *testing.T) {
	p := newPool(t, 2)
	s := tempSchema(t, p)
	a := &pgxAudit{p: p, name: s + ".audit"}
	exec(t, p, "CREATE TABLE "+a.name+" (entity text NOT NULL, seq bigint NOT NULL, pos bigint NOT NULL)")
	fail := true
	boom := errors.New("boom")
	m, err := idempgx.New(p, "ledger", idempgx.WithTable(s+".claims"), idempgx.WithOrdering(idempgx.Ordering{
		Release: func(ctx context.Context, tx pgx.Tx, pm idempotent.ParkedMessage) error {
			if fail {
				return boom
			}
			return a.record(ctx, tx, pm.OrderKey, pm.OrderSeq)
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if out, err := a.process(ctx, m, ordMsg("r", 2)); err != nil || out != idempotent.Parked {
		t.Fatal(out, err)
	}
	if _, err := a.process(ctx, m, ordMsg("r", 1)); !errors.Is(err, boom) {
		t.Fatalf("predecessor with a failing release: %v, want boom", err)
	}
	if got := a.applied(t, "r"); len(got) != 0 {
		t.Fatalf("applied %v though the transaction failed", got)
	}
	fail = false
	if out, err := a.process(ctx, m, ordMsg("r", 1)); err != nil || out != idempotent.Applied {
		t.Fatal(out, err)
	}
	if got := a.applied(t, "r"); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("applied %v, want 1 2", got)
	}
}

// TestOrderedBadInput: bad ordering fields, and ordered messages without
// WithOrdering, are refused with ErrInvalidOrder, nothing written.
func TestOrderedBadInput(t *testing.T) {
	p, s, a, m := orderedSetup(t, 2)
	ctx := context.Background()
	for name, msg := range map[string]idempotent.Message{
		"no sequence":     {Key: "b1", OrderKey: "x"},
		"no ordering key": {Key: "b2", OrderSeq: 1},
		"negative":        {Key: "b3", OrderKey: "x", OrderSeq: -1},
		"NUL":             {Key: "b4", OrderKey: "x\x00", OrderSeq: 1},
		"too long":        {Key: "b5", OrderKey: string(make([]byte, 600)), OrderSeq: 1},
	} {
		if _, err := a.process(ctx, m, msg); !errors.Is(err, idempotent.ErrInvalidOrder) {
			t.Errorf("%s: %v, want ErrInvalidOrder", name, err)
		}
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims"); n != 0 {
		t.Errorf("%d claims written", n)
	}
	if _, err := m.ProcessMessages(ctx, []idempotent.Message{ordMsg("x", 1)}, func(context.Context, pgx.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrInvalidOrder) {
		t.Errorf("ProcessMessages: %v, want ErrInvalidOrder", err)
	}
	if _, err := idempgx.New(p, "x", idempgx.WithOrdering(idempgx.Ordering{})); err == nil {
		t.Error("WithOrdering without Release accepted")
	}
}

// TestOrderedGapDeadLetter: a gap older than the timeout is reported and,
// under GapDeadLetter, its parked messages go to DeadLetter and leave the
// parking table with their claims, so that a replay parks again.
func TestOrderedGapDeadLetter(t *testing.T) {
	p := newPool(t, 2)
	s := tempSchema(t, p)
	a := &pgxAudit{p: p, name: s + ".audit"}
	exec(t, p, "CREATE TABLE "+a.name+" (entity text NOT NULL, seq bigint NOT NULL, pos bigint NOT NULL)")
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var dead []int64
	m, err := idempgx.New(p, "ledger", idempgx.WithTable(s+".claims"), idempgx.WithClock(func() time.Time { return now }),
		idempgx.WithOrdering(idempgx.Ordering{
			Release: func(ctx context.Context, tx pgx.Tx, pm idempotent.ParkedMessage) error {
				return a.record(ctx, tx, pm.OrderKey, pm.OrderSeq)
			},
			GapTimeout: time.Minute,
			Policy:     idempotent.GapDeadLetter,
			DeadLetter: func(_ context.Context, pm idempotent.ParkedMessage) error {
				dead = append(dead, pm.OrderSeq)
				return nil
			},
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []int64{1, 3, 4} {
		if _, err := a.process(ctx, m, ordMsg("d", q)); err != nil {
			t.Fatal(err)
		}
	}
	if gaps, err := m.CheckGaps(ctx); err != nil || len(gaps) != 0 {
		t.Fatalf("CheckGaps before the timeout: %+v, %v", gaps, err)
	}
	now = now.Add(2 * time.Minute)
	gaps, err := m.CheckGaps(ctx)
	if err != nil || len(gaps) != 1 || gaps[0].DeadLettered != 2 || !slices.Equal(dead, []int64{3, 4}) {
		t.Fatalf("CheckGaps: %+v, %v, dead-lettered %v; want one gap, 3 and 4 dead-lettered", gaps, err, dead)
	}
	if out, err := a.process(ctx, m, ordMsg("d", 3)); err != nil || out != idempotent.Parked {
		t.Fatalf("replay of 3: %v, %v; want Parked again", out, err)
	}
	if out, err := a.process(ctx, m, ordMsg("d", 2)); err != nil || out != idempotent.Applied {
		t.Fatalf("2: %v, %v", out, err)
	}
	if got := a.applied(t, "d"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("applied %v, want 1 2 3", got)
	}
}

// TestOrderedTableSkipResend: after an operator's ClaimTable.SkipGap
// (which applies nothing), the parked message that became next is re-sent
// under another message key: its sequence applies once, its successor is
// released, and the parked copy left below the last applied sequence is
// deleted by CheckGaps, its claim kept.
func TestOrderedTableSkipResend(t *testing.T) {
	p, s, a, m := orderedSetup(t, 2)
	ctx := context.Background()
	for _, q := range []int64{1, 3, 4} {
		if _, err := a.process(ctx, m, ordMsg("r", q)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := claimTable(t, p, idempotent.WithTable(s+".claims")).SkipGap(ctx, "ledger", "r", 2); err != nil {
		t.Fatal(err)
	}
	again := ordMsg("r", 3)
	again.Key = "r-3-resent"
	if out, err := a.process(ctx, m, again); err != nil || out != idempotent.Applied {
		t.Fatalf("re-sent 3: %v, %v; want Applied", out, err)
	}
	if got := a.applied(t, "r"); !slices.Equal(got, []int64{1, 3, 4}) {
		t.Fatalf("applied %v, want 1 3 4", got)
	}
	// The parked copy of 3 stays below the last applied sequence until
	// CheckGaps deletes it: the delivery's path touches nothing for it.
	if gaps, err := m.Waiting(ctx); err != nil || len(gaps) != 1 || gaps[0].NextParked != 3 || gaps[0].LastSeq != 4 {
		t.Errorf("Waiting: %+v, %v; want the stale copy of 3 below 4", gaps, err)
	}
	if gaps, err := m.CheckGaps(ctx); err != nil || len(gaps) != 0 {
		t.Errorf("CheckGaps: %+v, %v; want nothing", gaps, err)
	}
	if gaps, err := m.Waiting(ctx); err != nil || len(gaps) != 0 {
		t.Errorf("Waiting: %+v, %v; want nothing parked", gaps, err)
	}
	// The copy's claim stays: its redelivery is Duplicate.
	if out, err := a.process(ctx, m, ordMsg("r", 3)); err != nil || out != idempotent.Duplicate {
		t.Fatalf("redelivered 3: %v, %v; want Duplicate", out, err)
	}
	if got := a.applied(t, "r"); !slices.Equal(got, []int64{1, 3, 4}) {
		t.Fatalf("applied %v, want 1 3 4", got)
	}
}
