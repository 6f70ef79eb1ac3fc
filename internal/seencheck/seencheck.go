// Package seencheck holds a duplicate pre-check's scope, read once, and
// leaves the keys the pre-check knows out of a batch. It is generic in the
// scope's type, idempotent.SeenScope, which it cannot import. How a batch
// is asked and recorded (in one call where the pre-check can) is
// idempotent.SeenBatchOf, which the idempgx module uses too.
package seencheck

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

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
