package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/rabbitmq"
)

// start runs c on ch in a goroutine. done yields Run's result once it
// returns; stop cancels Run's context and returns that result. Cleanup stops
// it too.
func start(t *testing.T, c *rabbitmq.Consumer, ch rabbitmq.Channel) (stop func() error, done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	finished := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		runErr = c.Run(ctx, ch)
		close(finished)
		res <- runErr
	}()
	stop = func() error {
		cancel()
		select {
		case <-finished:
			return runErr
		case <-time.After(10 * time.Second):
			return errors.New("Run did not return within 10s of its context ending")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop, res
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func hasEvent(f *fakeChannel, e string) func() bool {
	return func() bool { return slices.Contains(f.log(), e) }
}

func newConsumer(t *testing.T, h rabbitmq.Handler, opts ...rabbitmq.Option) *rabbitmq.Consumer {
	t.Helper()
	c, err := rabbitmq.NewConsumer("orders", h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAcksAfterTheHandlerForAppliedAndDuplicate(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	c := newConsumer(t, func(_ context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		f.record("handled %d", d.DeliveryTag)
		if d.MessageId == "dup" {
			return idempotent.Duplicate, nil
		}
		return idempotent.Applied, nil
	}, rabbitmq.WithWorkers(1))
	stop, _ := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "new"})
	f.deliver(amqp.Delivery{MessageId: "dup"})
	waitFor(t, "two acks", hasEvent(f, "ack 2"))
	if err := stop(); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	want := []string{"handled 1", "ack 1", "handled 2", "ack 2", "cancel"}
	if got := f.log(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	if f.prefetch != 2 {
		t.Errorf("prefetch %d, want twice the workers (2)", f.prefetch)
	}
	want2 := rabbitmq.Stats{Delivered: 2, Applied: 1, Duplicates: 1, Acked: 2}
	if s := c.Stats(); s != want2 {
		t.Fatalf("stats %+v, want %+v", s, want2)
	}
}

type poisonedByApp struct{}

func (poisonedByApp) Error() string { return "customer does not exist" }

func TestSettlesFailuresByKind(t *testing.T) {
	t.Parallel()
	appPoison := errors.New("unknown customer")
	cases := []struct {
		name string
		err  error
		want string // the event for tag 1
	}{
		{"no key", fmt.Errorf("wrapped: %w", rabbitmq.ErrNoKey), "reject 1"},
		{"invalid key", fmt.Errorf("idempotent: %w: empty", idempotent.ErrInvalidKey), "reject 1"},
		{"beyond retention", fmt.Errorf("idempotent: %w", idempotent.ErrBeyondRetention), "reject 1"},
		{"event time in the future", fmt.Errorf("idempotent: %w", idempotent.ErrInvalidEventTime), "reject 1"},
		{"no partition yet", fmt.Errorf("idempotent: %w", idempotent.ErrNoPartition), "nack 1 requeue"},
		{"undecodable", fmt.Errorf("x: %w", rabbitmq.ErrUndecodable), "reject 1"},
		{"marked poison", rabbitmq.Poison(appPoison), "reject 1"},
		{"added predicate", fmt.Errorf("handler: %w", poisonedByApp{}), "reject 1"},
		{"database down", errors.New("dial tcp: connection refused"), "nack 1 requeue"},
		{"retries exhausted", &idempotent.RetriesExhaustedError{Attempts: 10, Err: errors.New("40001")}, "nack 1 requeue"},
		{"claim busy", fmt.Errorf("x: %w", idempotent.ErrClaimBusy), "nack 1 requeue"},
		{"autocommit bug", fmt.Errorf("x: %w", idempotent.ErrAutocommit), "reject 1"}, // every delivery would leave the transaction again
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeChannel()
			var settled atomic.Pointer[rabbitmq.Settlement]
			c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) { return 0, tc.err },
				rabbitmq.WithRequeueDelay(0),
				rabbitmq.WithPoison(func(err error) bool { return errors.As(err, new(poisonedByApp)) }),
				rabbitmq.WithOnSettle(func(_ context.Context, s rabbitmq.Settlement) { settled.Store(&s) }))
			stop, _ := start(t, c, f)
			f.deliver(amqp.Delivery{MessageId: "m"})
			waitFor(t, tc.want, hasEvent(f, tc.want))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			s := settled.Load()
			if s == nil || !errors.Is(s.Err, tc.err) || s.SettleErr != nil {
				t.Fatalf("settlement %+v, want Err %v and no SettleErr", s, tc.err)
			}
			wantAction := rabbitmq.Requeued
			if strings.HasPrefix(tc.want, "reject") {
				wantAction = rabbitmq.DeadLettered
			}
			if s.Action != wantAction {
				t.Fatalf("action %v, want %v", s.Action, wantAction)
			}
		})
	}
}

func TestRequeueWaitsTheDelay(t *testing.T) {
	t.Parallel()
	const delay = 80 * time.Millisecond
	f := newFakeChannel()
	var failedAt atomic.Int64
	c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) {
		failedAt.Store(time.Now().UnixNano())
		return 0, errors.New("database down")
	}, rabbitmq.WithRequeueDelay(delay), rabbitmq.WithWorkers(1))
	start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "m"})
	waitFor(t, "the nack", hasEvent(f, "nack 1 requeue"))
	if waited := time.Since(time.Unix(0, failedAt.Load())); waited < delay/2 {
		t.Fatalf("nacked %v after the failure, want at least half the requeue delay %v (the backoff's jitter)", waited, delay)
	}
	if s := c.Stats(); s.Requeued != 1 || s.Acked != 0 {
		t.Fatalf("stats %+v, want 1 requeued", s)
	}
}

func TestShutdownCutsTheRequeueDelayShort(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	failed := make(chan struct{})
	c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) {
		close(failed)
		return 0, errors.New("database down")
	}, rabbitmq.WithRequeueDelay(rabbitmq.MaxRequeueDelay), rabbitmq.WithWorkers(1))
	stop, _ := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "m"})
	<-failed
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !slices.Contains(got, "nack 1 requeue") {
		t.Fatalf("events %q: the failed delivery was not requeued before Run returned", got)
	}
}

func TestRunsExactlyTheConfiguredWorkers(t *testing.T) {
	t.Parallel()
	const workers = 3
	f := newFakeChannel()
	var inflight, peak atomic.Int32
	started := make(chan struct{}, 100)
	release := make(chan struct{})
	c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) {
		n := inflight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		started <- struct{}{}
		<-release
		inflight.Add(-1)
		return idempotent.Applied, nil
	}, rabbitmq.WithWorkers(workers), rabbitmq.WithPrefetch(10))
	start(t, c, f)
	for i := 0; i < 10; i++ {
		f.deliver(amqp.Delivery{MessageId: fmt.Sprint(i)})
	}
	for i := 0; i < workers; i++ {
		<-started
	}
	select {
	case <-started:
		t.Fatalf("a delivery started while %d workers were busy", workers)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	waitFor(t, "ten acks", func() bool { return c.Stats().Acked == 10 })
	if p := peak.Load(); p != workers {
		t.Fatalf("peak concurrency %d, want %d", p, workers)
	}
	if f.prefetch != 10 {
		t.Fatalf("prefetch %d, want 10", f.prefetch)
	}
}

func TestShutdownFinishesInFlightAndReleasesTheRest(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	started := make(chan uint64, 4)
	release := make(chan struct{})
	c := newConsumer(t, func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		started <- d.DeliveryTag
		<-release
		if err := ctx.Err(); err != nil {
			return 0, err // the handler's context must outlive Run's
		}
		f.record("committed %d", d.DeliveryTag)
		return idempotent.Applied, nil
	}, rabbitmq.WithWorkers(2), rabbitmq.WithPrefetch(4))
	stop, _ := start(t, c, f)
	for i := 0; i < 4; i++ {
		f.deliver(amqp.Delivery{MessageId: fmt.Sprint(i)})
	}
	a, b := <-started, <-started
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	waitFor(t, "the consumer to be cancelled", hasEvent(f, "cancel"))
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) with two deliveries in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Run after graceful shutdown: %v", err)
	}
	got := f.log()
	for _, tag := range []uint64{a, b} {
		if !slices.Contains(got, fmt.Sprintf("committed %d", tag)) || !slices.Contains(got, fmt.Sprintf("ack %d", tag)) {
			t.Fatalf("events %q: in-flight delivery %d not committed and acked before Run returned", got, tag)
		}
	}
	released := 0
	for _, e := range got {
		if strings.HasSuffix(e, " requeue") && strings.HasPrefix(e, "nack ") {
			released++
		}
	}
	want := rabbitmq.Stats{Delivered: 2, Applied: 2, Acked: 2, Released: 2}
	if s := c.Stats(); s != want || released != 2 {
		t.Fatalf("stats %+v (events %q), want %+v", s, got, want)
	}
}

func TestShutdownTimeoutCancelsInFlightHandlers(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	started := make(chan struct{})
	c := newConsumer(t, func(ctx context.Context, _ *amqp.Delivery) (idempotent.Outcome, error) {
		close(started)
		<-ctx.Done() // a transaction stuck on a lock
		return 0, ctx.Err()
	}, rabbitmq.WithWorkers(1), rabbitmq.WithShutdownTimeout(20*time.Millisecond), rabbitmq.WithRequeueDelay(rabbitmq.MaxRequeueDelay))
	stop, _ := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "m"})
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !slices.Contains(got, "nack 1 requeue") {
		t.Fatalf("events %q: the cancelled delivery was not requeued", got)
	}
}

func TestChannelClosedByTheBroker(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	started := make(chan struct{})
	release := make(chan struct{})
	var settled atomic.Pointer[rabbitmq.Settlement]
	c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) {
		close(started)
		<-release
		return idempotent.Applied, nil
	}, rabbitmq.WithWorkers(1), rabbitmq.WithOnSettle(func(_ context.Context, s rabbitmq.Settlement) { settled.Store(&s) }))
	_, done := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "m"})
	<-started
	f.closeWith(&amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure", Server: true})
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before the in-flight handler did", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	err := <-done
	var ae *amqp.Error
	if !errors.Is(err, rabbitmq.ErrChannelClosed) || !errors.As(err, &ae) || ae.Code != amqp.ConnectionForced {
		t.Fatalf("Run: %v, want ErrChannelClosed wrapping the broker's 320", err)
	}
	if !strings.Contains(err.Error(), `"orders"`) {
		t.Errorf("error %q does not name the queue", err)
	}
	if s := settled.Load(); s == nil || s.Action != rabbitmq.Acked || !errors.Is(s.SettleErr, amqp.ErrClosed) {
		t.Fatalf("settlement %+v, want a failed ack", s)
	}
	if s := c.Stats(); s.SettleFailed != 1 || s.Acked != 0 || s.Applied != 1 {
		t.Fatalf("stats %+v, want 1 applied and its ack failed", s)
	}
}

func TestChannelClosedByTheApplication(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) { return idempotent.Applied, nil })
	_, done := start(t, c, f)
	waitFor(t, "the consumer", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.tag != "" })
	f.closeWith(nil)
	if err := <-done; !errors.Is(err, rabbitmq.ErrChannelClosed) || !strings.Contains(err.Error(), "closed by the application") {
		t.Fatalf("Run: %v, want ErrChannelClosed (closed by the application)", err)
	}
}

func TestConsumerCancelledByTheBroker(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) { return idempotent.Applied, nil })
	_, done := start(t, c, f)
	waitFor(t, "the consumer", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.tag != "" })
	f.mu.Lock()
	f.closeDeliveries(false) // basic.cancel from the broker: the channel stays open
	f.mu.Unlock()
	if err := <-done; !errors.Is(err, rabbitmq.ErrConsumerCancelled) {
		t.Fatalf("Run: %v, want ErrConsumerCancelled", err)
	}
}

func TestRunReportsSetupErrors(t *testing.T) {
	t.Parallel()
	notFound := &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'orders' in vhost '/'", Server: true}
	f := newFakeChannel()
	f.consumeErr = notFound
	c := newConsumer(t, func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) { return idempotent.Applied, nil })
	err := c.Run(context.Background(), f)
	if !errors.Is(err, notFound) || !strings.Contains(err.Error(), `consume queue "orders"`) || errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("Run: %v, want the broker's NOT_FOUND naming the queue, not ErrChannelClosed", err)
	}
	// A channel already closed, or a connection dropped while Run sets up,
	// is one to reconnect after, as when it drops mid-stream.
	closed := newFakeChannel()
	closed.closeWith(nil)
	if err := c.Run(context.Background(), closed); !errors.Is(err, amqp.ErrClosed) || !errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("Run on a closed channel: %v, want amqp.ErrClosed matching ErrChannelClosed", err)
	}
	dropped := newFakeChannel()
	frame := &amqp.Error{Code: amqp.FrameError, Reason: "read tcp 127.0.0.1:36180->127.0.0.1:5672: use of closed network connection"}
	dropped.consumeErr = frame
	if err := c.Run(context.Background(), dropped); !errors.Is(err, frame) || !errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("Run whose connection dropped at basic.consume: %v, want the frame error matching ErrChannelClosed", err)
	}
	if err := c.Run(context.Background(), nil); err == nil {
		t.Fatal("Run with a nil channel: no error")
	}
}

func TestNewConsumerRejectsBadOptions(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *amqp.Delivery) (idempotent.Outcome, error) { return idempotent.Applied, nil }
	cases := []struct {
		name  string
		queue string
		h     rabbitmq.Handler
		opts  []rabbitmq.Option
		want  string
	}{
		{"empty queue", "", h, nil, "queue name"},
		{"long queue", strings.Repeat("q", 256), h, nil, "queue name"},
		{"nil handler", "q", nil, nil, "nil handler"},
		{"nil option", "q", h, []rabbitmq.Option{nil}, "nil option"},
		{"no workers", "q", h, []rabbitmq.Option{rabbitmq.WithWorkers(0)}, "WithWorkers"},
		{"too many workers", "q", h, []rabbitmq.Option{rabbitmq.WithWorkers(rabbitmq.MaxWorkers + 1)}, "WithWorkers"},
		{"zero prefetch", "q", h, []rabbitmq.Option{rabbitmq.WithPrefetch(0)}, "WithPrefetch"},
		{"prefetch below workers", "q", h, []rabbitmq.Option{rabbitmq.WithWorkers(8), rabbitmq.WithPrefetch(4)}, "less than the 8 workers"},
		{"negative delay", "q", h, []rabbitmq.Option{rabbitmq.WithRequeueDelay(-time.Second)}, "WithRequeueDelay"},
		{"long delay", "q", h, []rabbitmq.Option{rabbitmq.WithRequeueDelay(time.Hour)}, "WithRequeueDelay"},
		{"zero shutdown timeout", "q", h, []rabbitmq.Option{rabbitmq.WithShutdownTimeout(0)}, "WithShutdownTimeout"},
		{"nil poison", "q", h, []rabbitmq.Option{rabbitmq.WithPoison(nil)}, "WithPoison"},
		{"nil settle hook", "q", h, []rabbitmq.Option{rabbitmq.WithOnSettle(nil)}, "WithOnSettle"},
		{"empty tag", "q", h, []rabbitmq.Option{rabbitmq.WithConsumerTag("")}, "WithConsumerTag"},
		{"nil delivery context", "q", h, []rabbitmq.Option{rabbitmq.WithDeliveryContext(nil)}, "WithDeliveryContext"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := rabbitmq.NewConsumer(tc.queue, tc.h, tc.opts...)
			if err == nil || c != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewConsumer: (%v, %v), want an error mentioning %q", c, err, tc.want)
			}
		})
	}
	if _, err := rabbitmq.NewConsumer("q", h, rabbitmq.WithWorkers(8)); err != nil {
		t.Fatalf("8 workers with the default prefetch: %v", err)
	}
}

type traceKey struct{}

// WithDeliveryContext derives the context the handler and the settle
// function get, from the delivery (a trace id in its headers, say); a nil
// return keeps the Run's context.
func TestDeliveryContextReachesHandlerAndSettle(t *testing.T) {
	t.Parallel()
	f := newFakeChannel()
	c := newConsumer(t, func(ctx context.Context, d *amqp.Delivery) (idempotent.Outcome, error) {
		f.record("handled %d with %v", d.DeliveryTag, ctx.Value(traceKey{}))
		return idempotent.Applied, nil
	}, rabbitmq.WithWorkers(1),
		rabbitmq.WithDeliveryContext(func(ctx context.Context, d *amqp.Delivery) context.Context {
			if id, ok := d.Headers["trace-id"]; ok {
				return context.WithValue(ctx, traceKey{}, id)
			}
			return nil
		}),
		rabbitmq.WithOnSettle(func(ctx context.Context, s rabbitmq.Settlement) {
			f.record("settled %d with %v", s.Delivery.DeliveryTag, ctx.Value(traceKey{}))
		}))
	stop, _ := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "a", Headers: amqp.Table{"trace-id": "t1"}})
	f.deliver(amqp.Delivery{MessageId: "b"})
	waitFor(t, "two settlements", hasEvent(f, "settled 2 with <nil>"))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := []string{"handled 1 with t1", "ack 1", "settled 1 with t1", "handled 2 with <nil>", "ack 2", "settled 2 with <nil>", "cancel"}
	if got := f.log(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}
