package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

const queue = "orders"

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
		runErr = c.Run(ctx, ch, queue)
		close(finished)
		res <- runErr
	}()
	stop = func() error {
		cancel()
		select {
		case <-finished:
			return runErr
		case <-time.After(time.Minute):
			return errors.New("Run did not return within a minute of its context ending")
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

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []adapter.Event
}

func (r *recorder) Observe(_ context.Context, e adapter.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// all returns the events so far, of the given types (all with none).
func (r *recorder) all(types ...adapter.EventType) []adapter.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []adapter.Event
	for _, e := range r.events {
		if len(types) == 0 || slices.Contains(types, e.Type) {
			out = append(out, e)
		}
	}
	return out
}

// count returns a condition: at least n events of type typ.
func (r *recorder) count(typ adapter.EventType, n int) func() bool {
	return func() bool { return len(r.all(typ)) >= n }
}

func newConsumer(t *testing.T, mw *idempotent.Middleware, h rabbitmq.Handler, opts ...rabbitmq.Option) *rabbitmq.Consumer {
	t.Helper()
	c, err := rabbitmq.NewConsumer(mw, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// effect is a handler that writes one statement naming the delivery.
func effect(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
	_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + 50 -- "+d.MessageId)
	return err
}

func TestAcksAfterTheTransactionForAppliedAndDuplicate(t *testing.T) {
	t.Parallel()
	mw, db := newMiddleware(t)
	f := newFakeChannel()
	var rec recorder
	c := newConsumer(t, mw, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		f.record("handled %d", d.DeliveryTag)
		return effect(ctx, tx, d)
	}, rabbitmq.WithObserver(&rec))
	stop, _ := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "order-completed:1"})
	f.deliver(amqp.Delivery{MessageId: "order-completed:1", Redelivered: true})
	waitFor(t, "two acks", hasEvent(f, "ack 2"))
	if err := stop(); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	want := []string{"handled 1", "ack 1", "ack 2", "cancel"}
	if got := f.log(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q: the handler runs for the new claim only", got, want)
	}
	if f.prefetch != 2 {
		t.Errorf("prefetch %d, want twice the workers (2)", f.prefetch)
	}
	if s := c.Stats(); s != (adapter.Stats{Applied: 1, Duplicates: 1}) {
		t.Fatalf("stats %+v, want 1 applied and 1 duplicate", s)
	}
	if got := db.committed(); len(got) != 1 {
		t.Fatalf("committed effects %q, want one", got)
	}
	evs := rec.all()
	if len(evs) != 2 || evs[0].Type != adapter.EventApplied || evs[1].Type != adapter.EventDuplicate {
		t.Fatalf("events %+v, want applied then duplicate", evs)
	}
	for i, e := range evs {
		d, _ := e.Detail.(*amqp.Delivery)
		if e.Message.Key != "order-completed:1" || d == nil || d.DeliveryTag != uint64(i+1) || e.Attempt != 1 || e.Err != nil ||
			e.Source != fmt.Sprintf(`queue "orders", delivery tag %d`, i+1) {
			t.Errorf("event %d: %+v, want the key, the delivery as Detail, attempt 1 and the source", i, e)
		}
	}
}

type poisonedByApp struct{}

func (poisonedByApp) Error() string { return "customer does not exist" }

func TestSettlesFailuresByKind(t *testing.T) {
	t.Parallel()
	appPoison := errors.New("unknown customer")
	cases := []struct {
		name string
		d    amqp.Delivery
		err  error  // the handler's
		want error  // the settlement's, when not err
		ack  string // what the broker is told of tag 1
	}{
		{"no key", amqp.Delivery{}, nil, adapter.ErrNoKey, "reject 1"},
		{"key with NUL", amqp.Delivery{MessageId: "a\x00b"}, nil, idempotent.ErrInvalidKey, "reject 1"},
		{"bad event time header", amqp.Delivery{MessageId: "m", Headers: amqp.Table{adapter.EventTimeHeader: "1773489600"}}, nil, adapter.ErrBadEventTime, "reject 1"},
		{"beyond retention", amqp.Delivery{MessageId: "m", Headers: amqp.Table{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now().AddDate(0, -3, 0))}}, nil, idempotent.ErrBeyondRetention, "reject 1"},
		{"undecodable", amqp.Delivery{MessageId: "m"}, fmt.Errorf("x: %w", adapter.ErrUndecodable), nil, "reject 1"},
		{"marked poison", amqp.Delivery{MessageId: "m"}, adapter.Poison(appPoison), nil, "reject 1"},
		{"added predicate", amqp.Delivery{MessageId: "m"}, fmt.Errorf("handler: %w", poisonedByApp{}), nil, "reject 1"},
		{"database down", amqp.Delivery{MessageId: "m"}, errors.New("dial tcp: connection refused"), nil, "nack 1 requeue"},
		{"no partition yet", amqp.Delivery{MessageId: "m"}, fmt.Errorf("x: %w", idempotent.ErrNoPartition), nil, "nack 1 requeue"},
		{"claim busy", amqp.Delivery{MessageId: "m"}, fmt.Errorf("x: %w", idempotent.ErrClaimBusy), nil, "nack 1 requeue"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mw, db := newMiddleware(t)
			f := newFakeChannel()
			var rec recorder
			c := newConsumer(t, mw, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
				if err := effect(ctx, tx, d); err != nil {
					return err
				}
				return tc.err
			}, rabbitmq.WithRetryDelay(time.Millisecond, time.Millisecond),
				rabbitmq.WithPoison(func(err error) bool { return errors.As(err, new(poisonedByApp)) }),
				rabbitmq.WithObserver(&rec))
			stop, _ := start(t, c, f)
			f.deliver(tc.d)
			waitFor(t, tc.ack, hasEvent(f, tc.ack))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			want, typ := tc.want, adapter.EventRequeued
			if want == nil {
				want = tc.err
			}
			if strings.HasPrefix(tc.ack, "reject") {
				typ = adapter.EventDeadLettered
			}
			evs := rec.all()
			if len(evs) != 1 || evs[0].Type != typ || !errors.Is(evs[0].Err, want) {
				t.Fatalf("events %+v, want one %v with an error matching %v", evs, typ, want)
			}
			if got := db.committed(); len(got) != 0 {
				t.Fatalf("committed %q for a failed delivery", got)
			}
		})
	}
}

func TestRequeueWaitsTheRetryDelay(t *testing.T) {
	t.Parallel()
	const delay = 80 * time.Millisecond
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	var failedAt atomic.Int64
	var rec recorder
	c := newConsumer(t, mw, func(context.Context, *sql.Tx, *amqp.Delivery) error {
		failedAt.Store(time.Now().UnixNano())
		return errors.New("pricing service down")
	}, rabbitmq.WithRetryDelay(delay, delay), rabbitmq.WithObserver(&rec))
	start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "m"})
	waitFor(t, "the nack", hasEvent(f, "nack 1 requeue"))
	if waited := time.Since(time.Unix(0, failedAt.Load())); waited < delay/2 {
		t.Fatalf("nacked %v after the failure, want at least half the retry delay %v (the backoff's jitter)", waited, delay)
	}
	waitFor(t, "the event", rec.count(adapter.EventRequeued, 1))
	if e := rec.all()[0]; e.Delay < delay/2 || e.Delay > delay || e.Attempt != 1 {
		t.Fatalf("requeued after %v on attempt %d, want %v to %v on attempt 1", e.Delay, e.Attempt, delay/2, delay)
	}
	if s := c.Stats(); s.Requeued != 1 || s.Applied != 0 {
		t.Fatalf("stats %+v, want 1 requeued", s)
	}
}

// A quorum queue counts a message's deliveries in x-delivery-count: the
// retry delay doubles with each, up to its maximum.
func TestRetryDelayGrowsWithTheDeliveryCount(t *testing.T) {
	t.Parallel()
	const initial, maxDelay = 10 * time.Millisecond, 60 * time.Millisecond
	for _, tc := range []struct {
		count     any
		attempt   int
		low, high time.Duration
	}{
		{nil, 1, initial / 2, initial},
		{int64(1), 2, initial, 2 * initial},
		{int32(2), 3, 2 * initial, 4 * initial},
		{int64(9), 10, maxDelay / 2, maxDelay},
	} {
		t.Run(fmt.Sprint(tc.attempt), func(t *testing.T) {
			t.Parallel()
			mw, _ := newMiddleware(t)
			f := newFakeChannel()
			var rec recorder
			c := newConsumer(t, mw, func(context.Context, *sql.Tx, *amqp.Delivery) error { return errors.New("down") },
				rabbitmq.WithRetryDelay(initial, maxDelay), rabbitmq.WithObserver(&rec))
			start(t, c, f)
			d := amqp.Delivery{MessageId: "m"}
			if tc.count != nil {
				d.Headers = amqp.Table{"x-delivery-count": tc.count}
			}
			f.deliver(d)
			waitFor(t, "the requeue", rec.count(adapter.EventRequeued, 1))
			if e := rec.all()[0]; e.Attempt != tc.attempt || e.Delay < tc.low || e.Delay > tc.high {
				t.Fatalf("attempt %d held %v, want attempt %d held %v to %v", e.Attempt, e.Delay, tc.attempt, tc.low, tc.high)
			}
		})
	}
}

func TestShutdownCutsTheRetryDelayShort(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	failed := make(chan struct{})
	c := newConsumer(t, mw, func(context.Context, *sql.Tx, *amqp.Delivery) error {
		close(failed)
		return errors.New("database down")
	}, rabbitmq.WithRetryDelay(rabbitmq.MaxRetryDelay, rabbitmq.MaxRetryDelay))
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
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	var inflight, peak atomic.Int32
	started := make(chan struct{}, 100)
	release := make(chan struct{})
	c := newConsumer(t, mw, func(context.Context, *sql.Tx, *amqp.Delivery) error {
		n := inflight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		started <- struct{}{}
		<-release
		inflight.Add(-1)
		return nil
	}, rabbitmq.WithWorkers(workers), rabbitmq.WithPrefetch(10))
	start(t, c, f)
	for i := range 10 {
		f.deliver(amqp.Delivery{MessageId: fmt.Sprint(i)})
	}
	for range workers {
		<-started
	}
	select {
	case <-started:
		t.Fatalf("a delivery started while %d workers were busy", workers)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	waitFor(t, "ten acks", func() bool { return c.Stats().Applied == 10 })
	if p := peak.Load(); p != workers {
		t.Fatalf("peak concurrency %d, want %d", p, workers)
	}
	if f.prefetch != 10 {
		t.Fatalf("prefetch %d, want 10", f.prefetch)
	}
}

func TestShutdownFinishesInFlightAndReleasesTheRest(t *testing.T) {
	t.Parallel()
	mw, db := newMiddleware(t)
	f := newFakeChannel()
	started := make(chan uint64, 4)
	release := make(chan struct{})
	var rec recorder
	c := newConsumer(t, mw, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		started <- d.DeliveryTag
		<-release
		if err := ctx.Err(); err != nil {
			return err // the handler's context must outlive Run's
		}
		f.record("committing %d", d.DeliveryTag)
		return effect(ctx, tx, d)
	}, rabbitmq.WithWorkers(2), rabbitmq.WithPrefetch(4), rabbitmq.WithObserver(&rec))
	stop, _ := start(t, c, f)
	for i := range 4 {
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
		if !slices.Contains(got, fmt.Sprintf("committing %d", tag)) || !slices.Contains(got, fmt.Sprintf("ack %d", tag)) {
			t.Fatalf("events %q: in-flight delivery %d not committed and acked before Run returned", got, tag)
		}
	}
	released := 0
	for _, e := range got {
		if strings.HasPrefix(e, "nack ") && strings.HasSuffix(e, " requeue") {
			released++
		}
	}
	if s := c.Stats(); s != (adapter.Stats{Applied: 2, Released: 2}) || released != 2 || len(db.committed()) != 2 {
		t.Fatalf("stats %+v (events %q), want 2 applied and 2 released", s, got)
	}
	for _, e := range rec.all(adapter.EventReleased) {
		if e.Message.Key == "" || e.Err != nil {
			t.Errorf("released %+v, want its key and no error", e)
		}
	}
}

func TestShutdownTimeoutCancelsInFlightHandlers(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	started := make(chan struct{})
	c := newConsumer(t, mw, func(ctx context.Context, _ *sql.Tx, _ *amqp.Delivery) error {
		close(started)
		<-ctx.Done() // a transaction stuck on a lock
		return ctx.Err()
	}, rabbitmq.WithShutdownTimeout(20*time.Millisecond), rabbitmq.WithRetryDelay(rabbitmq.MaxRetryDelay, rabbitmq.MaxRetryDelay))
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
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	started := make(chan struct{})
	release := make(chan struct{})
	var rec recorder
	c := newConsumer(t, mw, func(context.Context, *sql.Tx, *amqp.Delivery) error {
		close(started)
		<-release
		return nil
	}, rabbitmq.WithObserver(&rec))
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
	evs := rec.all()
	if len(evs) != 2 || evs[0].Type != adapter.EventApplied || evs[1].Type != adapter.EventSettleFailed || !errors.Is(evs[1].Err, amqp.ErrClosed) || evs[1].Message.Key != "m" {
		t.Fatalf("events %+v, want applied, then its ack failed with amqp.ErrClosed", evs)
	}
	if s := c.Stats(); s != (adapter.Stats{Applied: 1, SettleFailed: 1}) {
		t.Fatalf("stats %+v, want 1 applied and its ack failed", s)
	}
}

func TestChannelClosedByTheApplication(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	c := newConsumer(t, mw, effect)
	_, done := start(t, c, f)
	waitFor(t, "the consumer", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.tag != "" })
	f.closeWith(nil)
	if err := <-done; !errors.Is(err, rabbitmq.ErrChannelClosed) || !strings.Contains(err.Error(), "closed by the application") {
		t.Fatalf("Run: %v, want ErrChannelClosed (closed by the application)", err)
	}
}

func TestConsumerCancelledByTheBroker(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	c := newConsumer(t, mw, effect)
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
	mw, _ := newMiddleware(t)
	notFound := &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'orders' in vhost '/'", Server: true}
	f := newFakeChannel()
	f.consumeErr = notFound
	c := newConsumer(t, mw, effect)
	err := c.Run(context.Background(), f, queue)
	if !errors.Is(err, notFound) || !strings.Contains(err.Error(), `consume queue "orders"`) || errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("Run: %v, want the broker's NOT_FOUND naming the queue, not ErrChannelClosed", err)
	}
	// A channel already closed, or a connection dropped while Run sets up,
	// is one to reconnect after, as when it drops mid-stream.
	closed := newFakeChannel()
	closed.closeWith(nil)
	if err := c.Run(context.Background(), closed, queue); !errors.Is(err, amqp.ErrClosed) || !errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("Run on a closed channel: %v, want amqp.ErrClosed matching ErrChannelClosed", err)
	}
	dropped := newFakeChannel()
	frame := &amqp.Error{Code: amqp.FrameError, Reason: "read tcp 127.0.0.1:36180->127.0.0.1:5672: use of closed network connection"}
	dropped.consumeErr = frame
	if err := c.Run(context.Background(), dropped, queue); !errors.Is(err, frame) || !errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("Run whose connection dropped at basic.consume: %v, want the frame error matching ErrChannelClosed", err)
	}
	if err := c.Run(context.Background(), nil, queue); err == nil {
		t.Fatal("Run with a nil channel: no error")
	}
	for _, q := range []string{"", strings.Repeat("q", 256)} {
		if err := c.Run(context.Background(), newFakeChannel(), q); err == nil || !strings.Contains(err.Error(), "queue name") {
			t.Fatalf("Run on queue %q: %v, want an error about the queue name", q, err)
		}
	}
}

func TestNewConsumerRejectsBadOptions(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t)
	pdb, _ := mocks.New(t) // nothing is sent
	partitioned, err := idempotent.New(pdb, postgres.New(), "loyalty", idempotent.WithDailyPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	at := func(*amqp.Delivery) (time.Time, error) { return time.Now(), nil }
	cases := []struct {
		name    string
		mw      *idempotent.Middleware
		h       rabbitmq.Handler
		opts    []rabbitmq.Option
		want    string
		wantErr error
	}{
		{"nil middleware", nil, effect, nil, "nil Middleware", nil},
		{"nil handler", mw, nil, nil, "nil handler", nil},
		{"nil option", mw, effect, []rabbitmq.Option{nil}, "nil option", nil},
		{"nil key", mw, effect, []rabbitmq.Option{rabbitmq.WithKey(nil)}, "WithKey", nil},
		{"no workers", mw, effect, []rabbitmq.Option{rabbitmq.WithWorkers(0)}, "WithWorkers", nil},
		{"too many workers", mw, effect, []rabbitmq.Option{rabbitmq.WithWorkers(adapter.MaxWorkers + 1)}, "WithWorkers", nil},
		{"zero prefetch", mw, effect, []rabbitmq.Option{rabbitmq.WithPrefetch(0)}, "WithPrefetch", nil},
		{"prefetch below workers", mw, effect, []rabbitmq.Option{rabbitmq.WithWorkers(8), rabbitmq.WithPrefetch(4)}, "less than the 8 workers", nil},
		{"zero retry delay", mw, effect, []rabbitmq.Option{rabbitmq.WithRetryDelay(0, time.Second)}, "WithRetryDelay", nil},
		{"retry delay above its maximum", mw, effect, []rabbitmq.Option{rabbitmq.WithRetryDelay(2*time.Second, time.Second)}, "WithRetryDelay", nil},
		{"long retry delay", mw, effect, []rabbitmq.Option{rabbitmq.WithRetryDelay(time.Second, time.Hour)}, "WithRetryDelay", nil},
		{"zero future bound", mw, effect, []rabbitmq.Option{rabbitmq.WithFutureBound(0)}, "WithFutureBound", nil},
		{"zero shutdown timeout", mw, effect, []rabbitmq.Option{rabbitmq.WithShutdownTimeout(0)}, "WithShutdownTimeout", nil},
		{"nil poison", mw, effect, []rabbitmq.Option{rabbitmq.WithPoison(nil)}, "WithPoison", nil},
		{"nil observer", mw, effect, []rabbitmq.Option{rabbitmq.WithObserver(nil)}, "WithObserver", nil},
		{"empty tag", mw, effect, []rabbitmq.Option{rabbitmq.WithConsumerTag("")}, "WithConsumerTag", nil},
		{"nil delivery context", mw, effect, []rabbitmq.Option{rabbitmq.WithDeliveryContext(nil)}, "WithDeliveryContext", nil},
		{"batch size", mw, effect, []rabbitmq.Option{rabbitmq.WithBatchSize(10)}, "NewBatchConsumer", nil},
		{"nil event time function", mw, effect, []rabbitmq.Option{rabbitmq.WithEventTime(nil)}, "WithEventTime", nil},
		{"two event time sources", mw, effect, []rabbitmq.Option{rabbitmq.WithEventTime(at), rabbitmq.WithTransportEventTime()}, "already set", nil},
		{"partitioned, the transport's time", partitioned, effect, []rabbitmq.Option{rabbitmq.WithTransportEventTime()}, "AMQP timestamp", adapter.ErrNoProducerEventTime},
		{"partitioned, no event time", partitioned, effect, []rabbitmq.Option{rabbitmq.WithoutEventTime()}, "WithoutEventTime", adapter.ErrNoProducerEventTime},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := rabbitmq.NewConsumer(tc.mw, tc.h, tc.opts...)
			if err == nil || c != nil || !strings.Contains(err.Error(), tc.want) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("NewConsumer: (%v, %v), want an error mentioning %q", c, err, tc.want)
			}
		})
	}
	// The header (the default) and a function are producers' times.
	for _, opts := range [][]rabbitmq.Option{nil, {rabbitmq.WithEventTime(at)}, {rabbitmq.WithWorkers(8)}} {
		if _, err := rabbitmq.NewConsumer(partitioned, effect, opts...); err != nil {
			t.Fatalf("partitioned with %d options: %v", len(opts), err)
		}
	}
}

type traceKey struct{}

// WithDeliveryContext derives the context the handler and the observer
// get, from the delivery (a trace id in its headers, say); a nil return
// keeps the Run's context.
func TestDeliveryContextReachesHandlerAndObserver(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t)
	f := newFakeChannel()
	c := newConsumer(t, mw, func(ctx context.Context, _ *sql.Tx, d *amqp.Delivery) error {
		f.record("handled %d with %v", d.DeliveryTag, ctx.Value(traceKey{}))
		return nil
	}, rabbitmq.WithDeliveryContext(func(ctx context.Context, d *amqp.Delivery) context.Context {
		if id, ok := d.Headers["trace-id"]; ok {
			return context.WithValue(ctx, traceKey{}, id)
		}
		return nil
	}), rabbitmq.WithObserver(adapter.ObserverFunc(func(ctx context.Context, e adapter.Event) {
		f.record("%v %d with %v", e.Type, e.Detail.(*amqp.Delivery).DeliveryTag, ctx.Value(traceKey{}))
	})))
	stop, _ := start(t, c, f)
	f.deliver(amqp.Delivery{MessageId: "a", Headers: amqp.Table{"trace-id": "t1"}})
	f.deliver(amqp.Delivery{MessageId: "b"})
	waitFor(t, "two settlements", hasEvent(f, "applied 2 with <nil>"))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := []string{"handled 1 with t1", "ack 1", "applied 1 with t1", "handled 2 with <nil>", "ack 2", "applied 2 with <nil>", "cancel"}
	if got := f.log(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}
