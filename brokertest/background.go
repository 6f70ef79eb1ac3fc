package brokertest

import (
	"context"
	"sync"
)

// Background runs one consumer's Run in a goroutine of its own, the part
// of a harness's [Consumer] every adapter's harness needs: Go starts it
// with a context that Stop cancels, and Stop waits for it to return. Its
// zero value is ready to use; it is safe for concurrent use.
type Background struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
}

// Go starts run in a goroutine, with a context Stop cancels. A run already
// started and not stopped is stopped first, without waiting.
func (b *Background) Go(run func(ctx context.Context) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.cancel, b.done = cancel, done
	go func() { done <- run(ctx) }()
}

// Cancel cancels the run's context without waiting for the run to return,
// as a Kill that must not wait for in-flight handlers does; a later Stop
// still waits for it.
func (b *Background) Cancel() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
	}
}

// Stop cancels the run's context and waits for the run to return, or for
// ctx to end (then it returns ctx's error and the run goes on ending on its
// own). It reports whether a run was there to stop, and what it returned.
// A second Stop finds none.
func (b *Background) Stop(ctx context.Context) (stopped bool, err error) {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.cancel, b.done = nil, nil
	b.mu.Unlock()
	if done == nil {
		return false, nil
	}
	cancel()
	select {
	case err = <-done:
		return true, err
	case <-ctx.Done():
		return true, ctx.Err()
	}
}
