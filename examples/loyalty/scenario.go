package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/rabbitmq"
)

// broker is where the scenario's messages live: the in-process broker or a
// real RabbitMQ.
type broker interface {
	describe() string
	queueName() string
	publish(ctx context.Context, msgs []amqp.Publishing) error
	// pending is how many messages the broker still holds for the queue.
	pending(ctx context.Context) (int, error)
	deadLettered(ctx context.Context) (int, error)
	// connect opens a consumer process's connection.
	connect(ctx context.Context) (brokerConn, error)
	close() error
}

// brokerConn is one consumer process's connection.
type brokerConn interface {
	channel() (rabbitmq.Channel, error)
	// drop closes the connection abruptly, as a crash or a network failure
	// does.
	drop()
	close()
}

// orderCompleted is the event the loyalty service consumes.
type orderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

func (o orderCompleted) points() int64 { return o.TotalCents / 100 }

// priceLookup stands for the call a consumer makes to work out the points
// (the customer's tier, a promotion): a millisecond of waiting, or longer
// where the HTTP mode's fault injector slowed the request (withSlowLookup).
func priceLookup(ctx context.Context) {
	d := time.Millisecond
	if slow, ok := ctx.Value(slowLookupKey{}).(time.Duration); ok {
		d = slow
	}
	time.Sleep(d)
}

// slowLookupKey is the context key of a slowed price lookup.
type slowLookupKey struct{}

// withSlowLookup makes the price lookups under ctx take d.
func withSlowLookup(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, slowLookupKey{}, d)
}

// load is the same stream of messages for both runs.
type load struct {
	orders    int
	customers int
	expected  int64
	main      []amqp.Publishing // every order, some twice in a row
	replay    []amqp.Publishing // old orders, replayed weeks later
	twice     int
}

const copyHeader = "x-demo-copy"

// makeLoad builds n orders. About 3% are published twice back to back — a
// producer retrying after a lost publisher confirm — so that two workers get
// the same order at the same moment. A tenth of the orders are replayed at
// the end, from an archive of dead letters "three weeks later", with new
// message ids, as replay tools assign them.
func makeLoad(n int, seed uint64) load {
	rng := rand.New(rand.NewPCG(seed, 0x10ca1))
	l := load{orders: n, customers: max(n/6, 10)}
	now := time.Now()
	msg := func(o orderCompleted, id string, at time.Time) amqp.Publishing {
		body, _ := json.Marshal(o)
		return amqp.Publishing{
			MessageId: id, Timestamp: at, Type: "OrderCompleted", ContentType: "application/json",
			AppId: "checkout", DeliveryMode: amqp.Persistent, Body: body,
		}
	}
	orders := make([]orderCompleted, n)
	for i := range orders {
		o := orderCompleted{OrderID: 100000 + int64(i), CustomerID: 1 + rng.Int64N(int64(l.customers)), TotalCents: 500 + 5*rng.Int64N(5000)}
		orders[i] = o
		l.expected += o.points()
		m := msg(o, "evt-"+strconv.FormatInt(o.OrderID, 10), now)
		l.main = append(l.main, m)
		if rng.IntN(100) < 3 {
			l.main = append(l.main, m)
			l.twice++
		}
	}
	weeksAgo := now.Add(-21 * 24 * time.Hour)
	for i := 0; i < n; i += 10 {
		m := msg(orders[i], "replay-"+strconv.Itoa(i/10), weeksAgo)
		m.Headers = amqp.Table{"x-replayed-from": "order-completed.dead-letters"}
		l.replay = append(l.replay, m)
	}
	for i := range l.main {
		l.main[i].Headers = withCopy(l.main[i].Headers, i)
	}
	for i := range l.replay {
		l.replay[i].Headers = withCopy(l.replay[i].Headers, len(l.main)+i)
	}
	return l
}

func withCopy(h amqp.Table, id int) amqp.Table {
	out := amqp.Table{copyHeader: int64(id)}
	for k, v := range h {
		out[k] = v
	}
	return out
}

// faults configures what goes wrong during a run.
type faults struct {
	// crashEvery makes every crashEvery-th delivery's process crash right
	// after the handler committed, before the ack.
	crashEvery int
	// drops is how many times, spread over the stream, a consumer
	// process's connection drops while its workers are busy.
	drops int
	// restart is how long a crashed process takes to come back.
	restart time.Duration
}

// result is one run's audit.
type result struct {
	name        string
	orders      int
	deliveries  int64
	duplicates  int64
	expected    int64
	credited    int64
	crashes     int64
	drops       int64
	deadLetters int
	elapsed     time.Duration
}

func (r result) excess() int64 { return r.credited - r.expected }

// progress is a snapshot for the progress display.
type progress struct {
	name           string
	settled, total int
	deliveries     int64
	crashes, drops int64
	elapsed        time.Duration
	done           bool
	crashWord      string // what the crashes are called on the line; "crashes" when empty
}

// consumeFunc runs one consumer process on its connection until the
// connection dies (an error) or ctx ends (nil).
type consumeFunc func(ctx context.Context, s *scenario, conn brokerConn) error

// errCrashed is what a consumeFunc returns when its process crashed; the
// process comes back after the restart delay.
var errCrashed = errors.New("consumer process crashed")

// scenario runs one consumer implementation through the load and faults.
type scenario struct {
	b         broker
	consume   consumeFunc
	ld        load
	f         faults
	consumers int
	workers   int

	settledFlags []atomic.Bool
	settled      atomic.Int64
	deliveries   atomic.Int64
	duplicates   atomic.Int64
	crashes      atomic.Int64
	naiveErrors  atomic.Int64 // the naive consumer's failed deliveries (a busy database), redelivered
	drops        atomic.Int64
	acks         atomic.Int64 // the library's acks on an AMQP broker, for its crashes

	mu    sync.Mutex
	err   error
	conns map[int]brokerConn
}

func (s *scenario) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

func (s *scenario) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// settle counts message copy id as settled, once.
func (s *scenario) settle(id int64) {
	if id < 0 || int(id) >= len(s.settledFlags) {
		return
	}
	if !s.settledFlags[id].Swap(true) {
		s.settled.Add(1)
	}
}

// process is one consumer process: it connects, consumes until its
// connection dies, and comes back after the restart delay.
func (s *scenario) process(ctx context.Context, i int) {
	for ctx.Err() == nil {
		conn, err := s.b.connect(ctx)
		if err != nil {
			s.fail(fmt.Errorf("consumer %d: connect: %w", i, err))
			return
		}
		s.mu.Lock()
		s.conns[i] = conn
		s.mu.Unlock()
		err = s.consume(ctx, s, conn)
		s.mu.Lock()
		delete(s.conns, i)
		s.mu.Unlock()
		conn.close()
		if err == nil {
			return
		}
		if !errors.Is(err, rabbitmq.ErrChannelClosed) && !errors.Is(err, amqp.ErrClosed) && !errors.Is(err, errCrashed) {
			s.fail(fmt.Errorf("consumer %d: %w", i, err))
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(s.f.restart):
		}
	}
}

// maxNaiveErrors is how many failed deliveries the naive consumer
// redelivers before the run ends with the last one's error.
const maxNaiveErrors = 100

// naiveDeliver is one delivery of a naive consumer loop (AMQP's, Kafka's,
// NATS's):
// it decodes the order in body, applies it with apply and counts it, and
// every crashEvery-th delivery crashes the process once, after the commit
// and before the loop can ack or commit its offset. It reports whether the
// loop goes on: false after a crash, a failure, or the run's end.
func (s *scenario) naiveDeliver(ctx context.Context, apply func(context.Context, orderCompleted) (idempotent.Outcome, error), body []byte, crashed *atomic.Bool, crash func()) bool {
	if crashed.Load() || ctx.Err() != nil {
		return false
	}
	var o orderCompleted
	if err := json.Unmarshal(body, &o); err != nil {
		s.fail(fmt.Errorf("decode order: %w", err))
		return false
	}
	n := s.deliveries.Add(1)
	out, err := apply(ctx, o)
	if err != nil {
		// The usual hand-written consumer does not ack a delivery that
		// failed (a database too busy to answer in time): its process
		// exits, comes back, and the broker delivers it again. One that
		// keeps failing ends the run.
		switch {
		case ctx.Err() != nil:
		case s.naiveErrors.Add(1) > maxNaiveErrors:
			s.fail(fmt.Errorf("%d deliveries failed, the last: %w", maxNaiveErrors+1, err))
		case !crashed.Swap(true):
			crash()
		}
		return false
	}
	if out == idempotent.Duplicate {
		s.duplicates.Add(1)
	}
	if s.f.crashEvery > 0 && n%int64(s.f.crashEvery) == 0 && !crashed.Swap(true) {
		s.crashes.Add(1)
		crash()
		return false
	}
	return true
}

// dropOne drops the connection of the k-th live process.
func (s *scenario) dropOne(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.consumers {
		if conn, ok := s.conns[(k+i)%s.consumers]; ok {
			s.drops.Add(1)
			conn.drop()
			return
		}
	}
}

// settleGrace is how long the consumers' settled count may stall before
// waitSettled asks the broker whether anything is still pending.
const settleGrace = 5 * time.Second

// waitSettled waits until target copies are settled and the broker holds
// nothing more, dropping a connection each time the next drop point passes.
func (s *scenario) waitSettled(ctx context.Context, target int, dropAt []int, report func(progress), p progress, start time.Time) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	stalled := time.Now()
	last := int64(-1)
	for k := 0; ; {
		settled := int(s.settled.Load())
		for k < len(dropAt) && settled >= dropAt[k] {
			s.dropOne(k)
			k++
		}
		if int64(settled) != last {
			last, stalled = int64(settled), time.Now()
		}
		p.settled, p.deliveries, p.crashes, p.drops, p.elapsed = settled, s.deliveries.Load(), s.crashes.Load(), s.drops.Load(), time.Since(start)
		report(p)
		if err := s.failed(); err != nil {
			return err
		}
		// Settled as the consumers report it, or — when that count stalls —
		// as the broker knows it: a process that crashed right after its
		// commit (or its ack) reached the server cannot report it, and
		// nothing will redeliver what the server has. The audit, not this
		// count, decides whether every effect applied exactly once.
		if settled >= target || time.Since(stalled) > settleGrace {
			n, err := s.b.pending(ctx)
			if err != nil {
				return fmt.Errorf("broker: %w", err)
			}
			if n == 0 {
				return nil
			}
		}
		if time.Since(stalled) > 2*time.Minute {
			return fmt.Errorf("no progress for 2 minutes: %d of %d messages settled", settled, target)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// runScenario runs the load once through h and audits the result.
func runScenario(ctx context.Context, name string, b broker, consume consumeFunc, credited func(context.Context) (int64, error),
	ld load, f faults, consumers, workers int, report func(progress)) (result, error) {
	s := &scenario{b: b, consume: consume, ld: ld, f: f, consumers: consumers, workers: workers,
		settledFlags: make([]atomic.Bool, len(ld.main)+len(ld.replay)), conns: map[int]brokerConn{}}
	start := time.Now()
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := range consumers {
		wg.Go(func() { s.process(pctx, i) })
	}
	finish := func(err error) (result, error) {
		stop()
		wg.Wait()
		if err == nil {
			err = s.failed()
		}
		return result{}, err
	}

	p := progress{name: name, total: len(ld.main) + len(ld.replay)}
	if err := b.publish(ctx, ld.main); err != nil {
		return finish(err)
	}
	var dropAt []int
	for k := 1; k <= f.drops; k++ {
		dropAt = append(dropAt, k*len(ld.main)/(f.drops+1))
	}
	if err := s.waitSettled(ctx, len(ld.main), dropAt, report, p, start); err != nil {
		return finish(err)
	}
	// Weeks later: someone replays old messages from the dead-letter archive.
	if err := b.publish(ctx, ld.replay); err != nil {
		return finish(err)
	}
	if err := s.waitSettled(ctx, len(ld.main)+len(ld.replay), nil, report, p, start); err != nil {
		return finish(err)
	}
	stop()
	wg.Wait()
	if err := s.failed(); err != nil {
		return result{}, err
	}
	r := result{name: name, orders: ld.orders, deliveries: s.deliveries.Load(), duplicates: s.duplicates.Load(),
		expected: ld.expected, crashes: s.crashes.Load(), drops: s.drops.Load(), elapsed: time.Since(start)}
	var err error
	if r.credited, err = credited(ctx); err != nil {
		return result{}, fmt.Errorf("audit: %w", err)
	}
	if r.deadLetters, err = b.deadLettered(ctx); err != nil {
		return result{}, fmt.Errorf("audit: %w", err)
	}
	p.settled, p.deliveries, p.crashes, p.drops, p.elapsed, p.done = p.total, r.deliveries, r.crashes, r.drops, r.elapsed, true
	report(p)
	return r, nil
}
