// Package seencheck consults a duplicate pre-check (an idempotent.Seen) for
// a batch of keys: in one call where the pre-check can answer a batch (an
// idempotent.SeenBatch), key by key otherwise; and it holds the pre-check's
// scope, read once. Package idempotent and the idempgx module share it, so
// that both read and record a batch the same way. It is generic in the
// scope's type, idempotent.SeenScope, which it cannot import.
package seencheck

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Seen is idempotent.Seen, with S the scope.
type Seen[S any] interface {
	Seen(ctx context.Context, scope S, key string) bool
	Record(ctx context.Context, scope S, key string, ttl time.Duration)
}

// batch is idempotent.SeenBatch less Seen.
type batch[S any] interface {
	SeenKeys(ctx context.Context, scope S, keys []string) []bool
	RecordKeys(ctx context.Context, scope S, keys []string, ttl time.Duration)
}

// Scoper gives a pre-check's scope: idempotent.Middleware, whose SeenScope
// reads it once.
type Scoper[S any] interface {
	SeenScope(ctx context.Context) (S, error)
}

// Before reports whether s, if any, knows key in sc's scope. Without a
// pre-check, or while the scope cannot be read, it is false: the pre-check
// is left out.
func Before[S any](ctx context.Context, s Seen[S], sc Scoper[S], key string) bool {
	if s == nil {
		return false
	}
	scope, err := sc.SeenScope(ctx)
	return err == nil && s.Seen(ctx, scope, key)
}

// Known reports which of keys s, if any, knows in sc's scope: nil without
// a pre-check or while the scope cannot be read.
func Known[S any](ctx context.Context, s Seen[S], sc Scoper[S], keys []string) []bool {
	if s == nil {
		return nil
	}
	scope, err := sc.SeenScope(ctx)
	if err != nil {
		return nil
	}
	return Keys(ctx, s, scope, keys)
}

// After tells s, if any, that the claims of keys in sc's scope are
// committed, to be remembered for ttl.
func After[S any](ctx context.Context, s Seen[S], sc Scoper[S], keys []string, ttl time.Duration) {
	if s == nil || len(keys) == 0 {
		return
	}
	if scope, err := sc.SeenScope(ctx); err == nil {
		Record(ctx, s, scope, keys, ttl)
	}
}

// Keys reports which of keys s knows in scope. An answer of the wrong
// length from a batch pre-check counts as a miss for every key.
func Keys[S any](ctx context.Context, s Seen[S], scope S, keys []string) []bool {
	if b, ok := s.(batch[S]); ok {
		if hit := b.SeenKeys(ctx, scope, keys); len(hit) == len(keys) {
			return hit
		}
		return make([]bool, len(keys))
	}
	hit := make([]bool, len(keys))
	for i, k := range keys {
		hit[i] = s.Seen(ctx, scope, k)
	}
	return hit
}

// Record tells s that the claims of keys in scope are committed.
func Record[S any](ctx context.Context, s Seen[S], scope S, keys []string, ttl time.Duration) {
	if len(keys) == 0 {
		return
	}
	if b, ok := s.(batch[S]); ok {
		b.RecordKeys(ctx, scope, keys, ttl)
		return
	}
	for _, k := range keys {
		s.Record(ctx, scope, k, ttl)
	}
}

// Unknown keeps, in place, the keys whose hit is false and the entries of
// first at the same positions, and returns both shortened.
func Unknown(hit []bool, keys []string, first []int) ([]string, []int) {
	n := 0
	for j := range keys {
		if !hit[j] {
			keys[n], first[n] = keys[j], first[j]
			n++
		}
	}
	return keys[:n], first[:n]
}

// RetryAfter is how long Scope.Get answers with the error of a failed read
// before it reads again.
const RetryAfter = 10 * time.Second

// Scope is a pre-check's scope, read once. Until a read succeeds, Get reads
// again at most once every RetryAfter, answering with the last error in
// between; a read cut short by its caller's context is not counted. Its
// zero value is ready to use; it must not be copied after first use.
type Scope[S any] struct {
	once   sync.Once
	sem    chan struct{} // held while a read runs
	val    atomic.Pointer[S]
	failed *failure         // the last failed read, under sem
	now    func() time.Time // time.Now when nil; tests replace it
}

type failure struct {
	at  time.Time
	err error
}

// Get returns the scope, reading it with read when no read has succeeded
// yet. A caller that finds a read under way waits for it, or until ctx is
// done.
func (s *Scope[S]) Get(ctx context.Context, read func(context.Context) (S, error)) (S, error) {
	if v := s.val.Load(); v != nil {
		return *v, nil
	}
	var zero S
	s.once.Do(func() { s.sem = make(chan struct{}, 1) })
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	defer func() { <-s.sem }()
	if v := s.val.Load(); v != nil {
		return *v, nil
	}
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	t := now()
	if f := s.failed; f != nil && t.Sub(f.at) < RetryAfter {
		return zero, f.err
	}
	v, err := read(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.failed = &failure{at: t, err: err}
		}
		return zero, err
	}
	s.failed = nil
	s.val.Store(&v)
	return v, nil
}
