package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

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
