package seencheck

import (
	"context"
	"errors"
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

// TestScope: the scope is read once; a failed read is answered from memory
// until RetryAfter has passed, then read again; a read cut short by its
// caller's context is not remembered; concurrent callers share one read.
func TestScope(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	var s Scope[string]
	s.now = func() time.Time { return now }
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
		t.Fatalf("once read: %q, %v after %d reads, want no read", v, err, reads)
	}

	// A read that fails because its caller gave up is not remembered.
	var c Scope[string]
	c.now = s.now
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
