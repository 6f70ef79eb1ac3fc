package seencheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestUnknown(t *testing.T) {
	keys, first := Unknown([]bool{true, false, true, false}, []string{"a", "b", "c", "d"}, []int{3, 0, 2, 1})
	if !slices.Equal(keys, []string{"b", "d"}) || !slices.Equal(first, []int{0, 1}) {
		t.Fatalf("Unknown = %v, %v; want [b d], [0 1]", keys, first)
	}
}

// TestScope: a read scope is answered from memory; a failed read is
// answered from memory until RetryAfter has passed, then read again; a
// read cut short by its caller's context is not remembered; concurrent
// callers share one read.
func TestScope(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	var s Scope[string]
	s.Now = func() time.Time { return now }
	reads := 0
	boom := errors.New("boom")
	fail := func(context.Context) (string, error) { reads++; return "", boom }
	ok := func(context.Context) (string, error) { reads++; return "scope", nil }

	if _, err := s.Get(ctx, fail); !errors.Is(err, boom) || reads != 1 {
		t.Fatalf("first read: %v after %d reads", err, reads)
	}
	now = now.Add(RetryAfter - time.Nanosecond)
	if _, err := s.Get(ctx, ok); !errors.Is(err, boom) || reads != 1 {
		t.Fatalf("within RetryAfter: %v after %d reads, want the last error and no read", err, reads)
	}
	now = now.Add(time.Nanosecond)
	if v, err := s.Get(ctx, ok); err != nil || v != "scope" || reads != 2 {
		t.Fatalf("after RetryAfter: %q, %v after %d reads", v, err, reads)
	}
	if v, err := s.Get(ctx, fail); err != nil || v != "scope" || reads != 2 {
		t.Fatalf("read: %q, %v after %d reads, want no read", v, err, reads)
	}

	// A read that fails because its caller gave up is not remembered.
	var c Scope[string]
	c.Now = s.Now
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Get(cctx, func(ctx context.Context) (string, error) { return "", ctx.Err() }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if v, err := c.Get(ctx, ok); err != nil || v != "scope" {
		t.Fatalf("after a cancelled read: %q, %v; want a fresh read", v, err)
	}

	// Concurrent callers: one read, the others wait for it.
	var p Scope[string]
	started, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	n := 0
	slow := func(context.Context) (string, error) {
		mu.Lock()
		n++
		mu.Unlock()
		close(started)
		<-release
		return "scope", nil
	}
	var wg sync.WaitGroup
	got := make([]string, 4)
	wg.Add(1)
	go func() { defer wg.Done(); got[0], _ = p.Get(ctx, slow) }()
	<-started
	for i := 1; i < len(got); i++ {
		wg.Add(1)
		go func() { defer wg.Done(); got[i], _ = p.Get(ctx, slow) }()
	}
	// A waiter whose context ends stops waiting.
	wctx, wcancel := context.WithCancel(ctx)
	wcancel()
	if _, err := p.Get(wctx, slow); !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter whose context ended: %v", err)
	}
	close(release)
	wg.Wait()
	if n != 1 || slices.ContainsFunc(got, func(v string) bool { return v != "scope" }) {
		t.Fatalf("%d reads, answers %q; want one read and four answers", n, got)
	}
}

// TestScopeAges: a scope is answered for MaxAge after its read began, by
// the Scope's clock, then read again; a read that fails then leaves no
// scope, and is not tried again before RetryAfter. A clock set back
// before the read also reads again.
func TestScopeAges(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	var s Scope[string]
	s.Now = func() time.Time { return now }
	name, reads := "one", 0
	var readErr error
	read := func(context.Context) (string, error) {
		reads++
		now = now.Add(time.Second) // a read takes time: the age counts from its start
		return name, readErr
	}
	if v, err := s.Get(ctx, read); err != nil || v != "one" || reads != 1 {
		t.Fatalf("first read: %q, %v after %d reads", v, err, reads)
	}
	now = now.Add(MaxAge - time.Second - time.Nanosecond)
	if v, err := s.Get(ctx, read); err != nil || v != "one" || reads != 1 {
		t.Fatalf("just under MaxAge: %q, %v after %d reads, want no read", v, err, reads)
	}
	now = now.Add(time.Nanosecond)
	name = "two"
	if v, err := s.Get(ctx, read); err != nil || v != "two" || reads != 2 {
		t.Fatalf("at MaxAge: %q, %v after %d reads, want a new read", v, err, reads)
	}

	// An aged scope whose read fails is gone: the error, then nothing
	// before RetryAfter.
	now = now.Add(MaxAge)
	boom := errors.New("boom")
	readErr = boom
	if v, err := s.Get(ctx, read); !errors.Is(err, boom) || v != "" || reads != 3 {
		t.Fatalf("aged, read fails: %q, %v after %d reads", v, err, reads)
	}
	readErr = nil
	now = now.Add(RetryAfter - 2*time.Second)
	if v, err := s.Get(ctx, read); !errors.Is(err, boom) || v != "" || reads != 3 {
		t.Fatalf("aged, within RetryAfter: %q, %v after %d reads, want the error and no read", v, err, reads)
	}
	now = now.Add(time.Second)
	name = "three"
	if v, err := s.Get(ctx, read); err != nil || v != "three" || reads != 4 {
		t.Fatalf("after RetryAfter: %q, %v after %d reads", v, err, reads)
	}

	// A clock set back before the read: read again.
	now = now.Add(-time.Hour)
	name = "four"
	if v, err := s.Get(ctx, read); err != nil || v != "four" || reads != 5 {
		t.Fatalf("clock set back: %q, %v after %d reads, want a new read", v, err, reads)
	}
}

// TestScopeForget: Forget drops the scope, whatever its age, and a read
// that Forget overtakes is not kept: it fails with ErrForgotten and the
// next Get reads again.
func TestScopeForget(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	var s Scope[string]
	s.Now = func() time.Time { return now }
	reads := 0
	read := func(context.Context) (string, error) { reads++; return fmt.Sprint("scope-", reads), nil }
	if v, err := s.Get(ctx, read); err != nil || v != "scope-1" {
		t.Fatalf("first read: %q, %v", v, err)
	}
	s.Forget()
	if v, err := s.Get(ctx, read); err != nil || v != "scope-2" || reads != 2 {
		t.Fatalf("after Forget: %q, %v after %d reads, want a new read", v, err, reads)
	}

	s.Forget()
	overtaken := func(context.Context) (string, error) {
		reads++
		s.Forget() // a lost connection seen while the read runs
		return "old", nil
	}
	if v, err := s.Get(ctx, overtaken); !errors.Is(err, ErrForgotten) || v != "" {
		t.Fatalf("a read overtaken by Forget: %q, %v; want ErrForgotten", v, err)
	}
	if v, err := s.Get(ctx, read); err != nil || v != "scope-4" || reads != 4 {
		t.Fatalf("after an overtaken read: %q, %v after %d reads, want a new read at once", v, err, reads)
	}
}
