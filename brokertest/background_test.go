package brokertest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/txclaim/idempotent/brokertest"
)

// TestBackground: Stop cancels the run's context, waits for it and reports
// its error; a second Stop finds nothing to stop; a Stop whose own context
// ends returns that context's error.
func TestBackground(t *testing.T) {
	var b brokertest.Background
	errRun := errors.New("run ended")
	b.Go(func(ctx context.Context) error {
		<-ctx.Done()
		return errRun
	})
	if stopped, err := b.Stop(context.Background()); !stopped || !errors.Is(err, errRun) {
		t.Fatalf("Stop = (%v, %v), want (true, the run's error)", stopped, err)
	}
	if stopped, err := b.Stop(context.Background()); stopped || err != nil {
		t.Fatalf("second Stop = (%v, %v), want (false, nil)", stopped, err)
	}
	release := make(chan struct{})
	b.Go(func(context.Context) error {
		<-release
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if stopped, err := b.Stop(ctx); !stopped || !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop with an ended context = (%v, %v), want (true, context.Canceled)", stopped, err)
	}
	close(release)
}
