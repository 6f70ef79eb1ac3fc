// Package seencheck holds a duplicate pre-check's scope, read from the
// database and read again when it has aged, and leaves the keys the
// pre-check knows out of a batch. It is generic in the scope's type,
// idempotent.SeenScope, which it cannot import. How a batch is asked and
// recorded (in one call where the pre-check can) is
// idempotent.SeenBatchOf, which the idempgx module uses too.
package seencheck

import (
	"context"
	"errors"
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

// MaxAge is how long Scope.Get answers with a scope it read: from the
// moment that read began, by the Scope's clock. After it, the scope is
// read again before it is used, so that a process that runs on through a
// restart, failover or restore of the database answers from the old scope
// for at most MaxAge after its last read (less when it saw a connection
// lost: Forget).
const MaxAge = 5 * time.Second

// ErrForgotten is returned by Get for a read that Forget overtook: what it
// read may have come from the server whose connection was lost.
var ErrForgotten = errors.New("the scope was forgotten while it was read (a connection to the database was lost)")

// Scope is a pre-check's scope, read from the database. Get reads it on
// first use and again once it is MaxAge old; until a read succeeds it
// reads at most once every RetryAfter, answering with the last error in
// between (a read cut short by its caller's context is not counted).
// Forget drops it at once. Its zero value is ready to use; it must not be
// copied after first use.
type Scope[S any] struct {
	// Now is the clock that ages the scope and spaces failed reads: the
	// Middleware's (WithClock), so that tests move it. time.Now when nil.
	// Set it before first use.
	Now func() time.Time

	once   sync.Once
	sem    chan struct{} // held while a read runs
	val    atomic.Pointer[reading[S]]
	gen    atomic.Uint64 // counts Forget calls
	failed *failure      // the last failed read, under sem
}

// reading is a scope and the time its read began.
type reading[S any] struct {
	v  S
	at time.Time
}

type failure struct {
	at  time.Time
	err error
}

func (s *Scope[S]) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// fresh reports whether r may still be used at t: read no more than
// MaxAge before t (and not after it, which a clock set back shows).
func fresh[S any](r *reading[S], t time.Time) bool {
	if r == nil {
		return false
	}
	age := t.Sub(r.at)
	return age >= 0 && age < MaxAge
}

// Get returns the scope, reading it with read when none was read yet, the
// last read is MaxAge old, or Forget dropped it. A caller that finds a
// read under way waits for it, or until ctx is done. A failed read leaves
// no scope: the caller must leave the pre-check out.
func (s *Scope[S]) Get(ctx context.Context, read func(context.Context) (S, error)) (S, error) {
	if r := s.val.Load(); fresh(r, s.now()) {
		return r.v, nil
	}
	var zero S
	s.once.Do(func() { s.sem = make(chan struct{}, 1) })
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	defer func() { <-s.sem }()
	t := s.now()
	if r := s.val.Load(); fresh(r, t) {
		return r.v, nil
	}
	s.val.Store(nil) // aged: never used again
	if f := s.failed; f != nil && t.Sub(f.at) >= 0 && t.Sub(f.at) < RetryAfter {
		return zero, f.err
	}
	gen := s.gen.Load()
	v, err := read(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.failed = &failure{at: t, err: err}
		}
		return zero, err
	}
	if s.gen.Load() != gen {
		return zero, ErrForgotten
	}
	s.failed = nil
	r := &reading[S]{v: v, at: t}
	s.val.Store(r)
	if s.gen.Load() != gen {
		// Forget ran between the check above and the Store, which its
		// own Store(nil) may have preceded: drop r.
		s.val.CompareAndSwap(r, nil)
		return zero, ErrForgotten
	}
	return v, nil
}

// Forget drops the scope, so that the next Get reads it again; a read
// under way when Forget is called is not kept. A Middleware calls it when
// one of its transactions lost its connection: the server may have
// restarted, failed over or been restored.
func (s *Scope[S]) Forget() {
	s.gen.Add(1)
	s.val.Store(nil)
}
