package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent"
)

// recordingSeen is a Seen that answers from a map and records every call.
type recordingSeen struct {
	mu       sync.Mutex
	known    map[[2]string]bool
	recorded []string
	ttls     []time.Duration
	asked    int
}

func (s *recordingSeen) Seen(_ context.Context, consumer, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked++
	return s.known[[2]string{consumer, key}]
}

func (s *recordingSeen) Record(_ context.Context, consumer, key string, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recorded = append(s.recorded, consumer+"/"+key)
	s.ttls = append(s.ttls, ttl)
}

func TestSeenHitSendsNothing(t *testing.T) {
	r := newRecorded(t)
	s := &recordingSeen{known: map[[2]string]bool{{consumer, key}: true}}
	mw := newMiddleware(t, r, idempotent.WithSeen(s))
	got, err := mw.Process(context.Background(), key, func(context.Context, *sql.Tx) error {
		t.Error("the handler ran for a known duplicate")
		return nil
	})
	if err != nil || got != idempotent.Duplicate {
		t.Fatalf("got (%v, %v), want duplicate", got, err)
	}
	r.wantCalls(t)
}

func TestSeenMissGoesToClaimAndRecordsAfterCommit(t *testing.T) {
	r := newRecorded(t)
	// Known for another consumer only: entries are consumer-scoped.
	s := &recordingSeen{known: map[[2]string]bool{{"other", key}: true}}
	mw := newMiddleware(t, r, idempotent.WithSeen(s), idempotent.WithRetention(48*time.Hour))
	expectApplied(r.mock, key)
	got, err := mw.Process(context.Background(), key, effect)
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	r.wantCalls(t, "BEGIN", claimSQL, effectSQL, "COMMIT")
	if len(s.recorded) != 1 || s.recorded[0] != consumer+"/"+key || s.ttls[0] != 48*time.Hour {
		t.Fatalf("recorded %v with %v, want %s/%s for the retention window", s.recorded, s.ttls, consumer, key)
	}
}

func TestSeenNotRecordedWhenTheClaimRolledBack(t *testing.T) {
	r := newRecorded(t)
	s := &recordingSeen{}
	mw := newMiddleware(t, r, idempotent.WithSeen(s))
	r.mock.ExpectBegin()
	expectClaim(r.mock, key, 1)
	r.mock.ExpectRollback()
	boom := errors.New("boom")
	if _, err := mw.Process(context.Background(), key, func(context.Context, *sql.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if len(s.recorded) != 0 {
		t.Fatalf("recorded %v for a delivery that rolled back", s.recorded)
	}
}

func TestWithSeenNil(t *testing.T) {
	r := newRecorded(t)
	if _, err := idempotent.New(r.db, pg, consumer, idempotent.WithSeen(nil)); err == nil {
		t.Fatal("WithSeen(nil) accepted")
	}
}

func TestSeenLRU(t *testing.T) {
	ctx := context.Background()
	if _, err := idempotent.NewSeenLRU(0); err == nil {
		t.Fatal("capacity 0 accepted")
	}
	s, err := idempotent.NewSeenLRU(2)
	if err != nil {
		t.Fatal(err)
	}
	if s.Seen(ctx, "c", "a") {
		t.Fatal("empty LRU saw a key")
	}
	s.Record(ctx, "c", "a", time.Hour)
	s.Record(ctx, "c", "b", time.Hour)
	if !s.Seen(ctx, "c", "a") || s.Seen(ctx, "d", "a") {
		t.Fatal("consumer scoping broken")
	}
	// "a" was used last: recording "c" evicts "b".
	s.Record(ctx, "c", "c", time.Hour)
	if s.Len() != 2 || s.Seen(ctx, "c", "b") || !s.Seen(ctx, "c", "a") || !s.Seen(ctx, "c", "c") {
		t.Fatalf("eviction: len %d", s.Len())
	}
	s.Record(ctx, "c", "z", 0)
	if s.Seen(ctx, "c", "z") {
		t.Fatal("a zero ttl recorded the key")
	}
	// Expiry, with a tiny ttl: expired entries are misses.
	s.Record(ctx, "c", "short", time.Nanosecond)
	deadline := time.Now().Add(time.Second)
	for s.Seen(ctx, "c", "short") {
		if time.Now().After(deadline) {
			t.Fatal("entry did not expire")
		}
	}
}

// batchSeen is a recordingSeen that answers and records batches itself
// (SeenBatch), or answers a batch with a slice of the wrong length.
type batchSeen struct {
	recordingSeen
	batchAsks, batchRecords int
	wrongLength             bool
}

func (s *batchSeen) SeenKeys(ctx context.Context, consumer string, keys []string) []bool {
	s.mu.Lock()
	s.batchAsks++
	s.mu.Unlock()
	if s.wrongLength {
		return []bool{true}
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		out[i] = s.recordingSeen.Seen(ctx, consumer, k)
	}
	return out
}

func (s *batchSeen) RecordKeys(ctx context.Context, consumer string, keys []string, ttl time.Duration) {
	s.mu.Lock()
	s.batchRecords++
	s.mu.Unlock()
	for _, k := range keys {
		s.recordingSeen.Record(ctx, consumer, k, ttl)
	}
}

// TestSeenBatch: a batch claims only the keys the pre-check does not know,
// opens no transaction when it knows them all, and records the claimed keys
// only after the commit — key by key, or in one call where the pre-check is
// a SeenBatch.
func TestSeenBatch(t *testing.T) {
	ctx := context.Background()
	keys := []string{"c", "a", "b", "a"}
	for _, batch := range []bool{false, true} {
		name := "Seen"
		if batch {
			name = "SeenBatch"
		}
		t.Run(name+": known keys are not claimed", func(t *testing.T) {
			r := newRecorded(t)
			bs := &batchSeen{recordingSeen: recordingSeen{known: map[[2]string]bool{{consumer, "a"}: true}}}
			var s idempotent.Seen = &bs.recordingSeen
			if batch {
				s = bs
			}
			mw := newMiddleware(t, r, idempotent.WithSeen(s))
			r.mock.ExpectBegin()
			r.mock.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"b", "c"})).
				WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("c"))
			expectEffect(r.mock)
			r.mock.ExpectCommit()
			var fresh []int
			outs, err := mw.ProcessBatch(ctx, keys, func(ctx context.Context, tx *sql.Tx, f []int) error {
				fresh = f
				return effect(ctx, tx)
			})
			want := []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate}
			if err != nil || !slices.Equal(outs, want) || !slices.Equal(fresh, []int{0}) {
				t.Fatalf("got (%v, %v), fresh %v; want %v, fresh [0]", outs, err, fresh, want)
			}
			r.wantCalls(t, "BEGIN", batchSQL, effectSQL, "COMMIT")
			if !slices.Equal(bs.recorded, []string{consumer + "/b", consumer + "/c"}) {
				t.Fatalf("recorded %v, want the claimed keys b and c", bs.recorded)
			}
			if batch && (bs.batchAsks != 1 || bs.batchRecords != 1) {
				t.Fatalf("%d SeenKeys and %d RecordKeys calls, want one each", bs.batchAsks, bs.batchRecords)
			}
		})
	}
	t.Run("all known: no transaction", func(t *testing.T) {
		r := newRecorded(t)
		s := &recordingSeen{known: map[[2]string]bool{{consumer, "a"}: true, {consumer, "b"}: true, {consumer, "c"}: true}}
		mw := newMiddleware(t, r, idempotent.WithSeen(s))
		outs, err := mw.ProcessBatch(ctx, keys, func(context.Context, *sql.Tx, []int) error {
			t.Error("the handler ran for known duplicates")
			return nil
		})
		if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate}) {
			t.Fatalf("got (%v, %v), want four duplicates", outs, err)
		}
		r.wantCalls(t)
	})
	t.Run("rolled back: nothing recorded", func(t *testing.T) {
		r := newRecorded(t)
		s := &recordingSeen{}
		mw := newMiddleware(t, r, idempotent.WithSeen(s))
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, sqlmock.AnyArg()).
			WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("a").AddRow("b").AddRow("c"))
		r.mock.ExpectRollback()
		boom := errors.New("boom")
		if _, err := mw.ProcessBatch(ctx, keys, func(context.Context, *sql.Tx, []int) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("err = %v, want boom", err)
		}
		if len(s.recorded) != 0 {
			t.Fatalf("recorded %v for a batch that rolled back", s.recorded)
		}
	})
	t.Run("a SeenBatch answer of the wrong length is a miss", func(t *testing.T) {
		r := newRecorded(t)
		bs := &batchSeen{wrongLength: true}
		mw := newMiddleware(t, r, idempotent.WithSeen(bs))
		r.mock.ExpectBegin()
		r.mock.ExpectQuery(batchSQL).WithArgs(consumer, pg.BatchKeysArg([]string{"a", "b", "c"})).
			WillReturnRows(sqlmock.NewRows([]string{"message_key"}))
		r.mock.ExpectRollback()
		outs, err := mw.ProcessBatch(ctx, keys, func(context.Context, *sql.Tx, []int) error { return nil })
		if err != nil || slices.Contains(outs, idempotent.Applied) {
			t.Fatalf("got (%v, %v), want four duplicates found by the claim", outs, err)
		}
		r.wantCalls(t, "BEGIN", batchSQL, "ROLLBACK")
	})
}
