package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txclaim/idempotent/adapter"
)

// Recorder is an adapter.Observer that counts the events by type and key,
// and wakes Until at each one.
type Recorder struct {
	mu     sync.Mutex
	counts map[adapter.EventType]map[string]int
	total  map[adapter.EventType]int
	signal chan struct{}
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{counts: map[adapter.EventType]map[string]int{}, total: map[adapter.EventType]int{}, signal: make(chan struct{}, 1)}
}

// Observe is adapter.Observer.
func (r *Recorder) Observe(_ context.Context, e adapter.Event) {
	r.mu.Lock()
	if r.counts[e.Type] == nil {
		r.counts[e.Type] = map[string]int{}
	}
	r.counts[e.Type][e.Message.Key]++
	r.total[e.Type]++
	r.mu.Unlock()
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// Count returns how many events of type typ were reported for key.
func (r *Recorder) Count(typ adapter.EventType, key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[typ][key]
}

// Sum returns how many events of type typ were reported.
func (r *Recorder) Sum(typ adapter.EventType) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total[typ]
}

// Until polls cond at each event, and every few milliseconds, for at most
// timeout, and fails t if it never held.
func (r *Recorder) Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-r.signal:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("after %v: still not %s", timeout, what)
		}
	}
}
