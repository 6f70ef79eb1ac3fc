package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
)

// orderHandler is the loyalty consumer's effect as users write it with the
// adapter: the JSON body decoded, the credit in the claim's transaction.
func (l *loyalty) orderHandler() rabbitmq.Handler {
	return rabbitmq.Decode(rabbitmq.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *amqp.Delivery) error {
		return l.credit(ctx, tx, o)
	})
}

// orderConsumer is the loyalty consumer: key from the producer's
// message_id, event time from its Idempotent-Event-Time header (both the
// defaults), orderHandler's credit.
func (l *loyalty) orderConsumer(t testing.TB, opts ...rabbitmq.Option) *rabbitmq.Consumer {
	t.Helper()
	c, err := rabbitmq.NewConsumer(l.mw, l.orderHandler(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// settlements records a Consumer's events by message id.
type settlements struct {
	mu sync.Mutex
	by map[string][]adapter.Event
}

func (s *settlements) Observe(_ context.Context, e adapter.Event) {
	d, _ := e.Detail.(*amqp.Delivery)
	if d == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string][]adapter.Event{}
	}
	s.by[d.MessageId] = append(s.by[d.MessageId], e)
}

// types returns the types of id's events, in order.
func (s *settlements) types(id string) []adapter.EventType {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []adapter.EventType
	for _, e := range s.by[id] {
		out = append(out, e.Type)
	}
	return out
}

// first and last return id's first and last events.
func (s *settlements) first(id string) adapter.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.by[id]) == 0 {
		return adapter.Event{}
	}
	return s.by[id][0]
}

func (s *settlements) last(id string) adapter.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := s.by[id]
	if len(all) == 0 {
		return adapter.Event{}
	}
	return all[len(all)-1]
}

// seen is one delivery's outcome, as the observer heard it.
type seen struct {
	event       adapter.EventType
	redelivered bool
}

// outcomes returns the outcome events of every delivery, in order, with
// their redelivered flags.
func (s *settlements) outcomes() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []seen
	for _, evs := range s.by {
		for _, e := range evs {
			if e.Type == adapter.EventApplied || e.Type == adapter.EventDuplicate {
				out = append(out, seen{e.Type, e.Detail.(*amqp.Delivery).Redelivered})
			}
		}
	}
	return out
}

// ackHookChannel is a channel whose deliveries call before, with the
// delivery, when the Consumer acks them and before the ack is sent: a test
// crashes the process there, after the commit and before the ack.
type ackHookChannel struct {
	*amqp.Channel
	before func(d *amqp.Delivery)
}

func (ch *ackHookChannel) Consume(queue, consumer string, autoAck, exclusive, noLocal, noWait bool, args amqp.Table) (<-chan amqp.Delivery, error) {
	in, err := ch.Channel.Consume(queue, consumer, autoAck, exclusive, noLocal, noWait, args)
	if err != nil {
		return nil, err
	}
	out := make(chan amqp.Delivery)
	go func() {
		defer close(out)
		for d := range in {
			orig := d
			d.Acknowledger = hookedAck{Acknowledger: d.Acknowledger, before: func() { ch.before(&orig) }}
			out <- d
		}
	}()
	return out, nil
}

type hookedAck struct {
	amqp.Acknowledger
	before func()
}

func (a hookedAck) Ack(tag uint64, multiple bool) error {
	a.before()
	return a.Acknowledger.Ack(tag, multiple)
}

// runUntil runs c on queue, on a new channel of conn, until cond holds, then shuts it down gracefully and returns Run's
// result.
func runUntil(t *testing.T, c *rabbitmq.Consumer, conn *amqp.Connection, queue, what string, cond func() bool) error {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- c.Run(ctx, ch, queue) }()
	deadline := time.After(60 * time.Second)
	for !cond() {
		select {
		case err := <-res:
			t.Fatalf("Run returned before %s: %v", what, err)
		case <-deadline:
			t.Fatalf("timed out waiting for %s (stats %+v)", what, c.Stats())
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	return <-res
}

// crashAfterCommit runs c on a channel of a new process whose socket
// closes when the first delivery is acked — after its commit, before the
// ack leaves — and returns Run's error.
func crashAfterCommit(t *testing.T, url, queue string, c *rabbitmq.Consumer) error {
	t.Helper()
	p, err := dialProcess(url)
	if err != nil {
		t.Fatal(err)
	}
	defer p.conn.Close()
	ch, err := p.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return c.Run(context.Background(), &ackHookChannel{Channel: ch, before: func(*amqp.Delivery) { p.crash() }}, queue)
}

func TestRabbitMQCrashAfterCommitBeforeAckIsRedeliveredAsDuplicate(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	db := openDB(t, 4)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	msg := order{OrderID: 9912, CustomerID: 7, Points: 50}
	newPublisher(t, admin, top.queue).publish(t, orderMessage(t, msg))

	// The first consumer process commits the credit, then dies before its
	// ack leaves: the socket closes under it.
	var log settlements
	first := l.orderConsumer(t, rabbitmq.WithObserver(&log))
	if err := crashAfterCommit(t, url, top.queue, first); !errors.Is(err, rabbitmq.ErrChannelClosed) {
		t.Fatalf("first Run: %v, want ErrChannelClosed", err)
	}
	if s := first.Stats(); s.Applied != 1 || s.SettleFailed != 1 {
		t.Fatalf("first consumer: %+v, want 1 applied whose ack failed", s)
	}

	// The broker redelivers to the next consumer, which finds the claim.
	second := l.orderConsumer(t, rabbitmq.WithObserver(&log))
	if err := runUntil(t, second, dialTest(t, url), top.queue, "the redelivery's ack", func() bool { return second.Stats().Duplicates == 1 }); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if s := second.Stats(); s.SettleFailed != 0 || s.Applied != 0 {
		t.Fatalf("second consumer: %+v, want 1 duplicate acked", s)
	}
	want := []seen{{adapter.EventApplied, false}, {adapter.EventDuplicate, true}}
	if got := log.outcomes(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("deliveries (outcome, redelivered) %v, want %v", got, want)
	}
	if b := l.balance(t, 7); b != msg.Points {
		t.Fatalf("balance %d, want %d", b, msg.Points)
	}
	if n := l.ledgerRows(t, 9912); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	if n := depth(t, admin, top.queue); n != 0 {
		t.Fatalf("%d messages left in the queue, want 0", n)
	}
}

func TestRabbitMQPoisonGoesToTheDeadLetterQueue(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	db := openDB(t, 4)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	good := order{OrderID: 1, CustomerID: 3, Points: 12}
	noKey := orderMessage(t, order{OrderID: 2, CustomerID: 3, Points: 9})
	noKey.MessageId = ""
	badBody := amqp.Publishing{MessageId: "order-completed:3", Body: []byte("order 3, customer 3, 9 euros")}
	nulKey := orderMessage(t, order{OrderID: 4, CustomerID: 3, Points: 9})
	nulKey.MessageId = "order-completed:\x004"
	newPublisher(t, admin, top.queue).publish(t, noKey, badBody, orderMessage(t, good), nulKey)

	var log settlements
	c := l.orderConsumer(t, rabbitmq.WithObserver(&log))
	if err := runUntil(t, c, dialTest(t, url), top.queue, "all four settled", func() bool {
		s := c.Stats()
		return s.Applied+s.DeadLettered == 4
	}); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s != (adapter.Stats{Applied: 1, DeadLettered: 3}) {
		t.Fatalf("stats %+v, want 1 applied and 3 dead-lettered", s)
	}
	for id, want := range map[string]error{"": adapter.ErrNoKey, "order-completed:3": adapter.ErrUndecodable, "order-completed:\x004": idempotent.ErrInvalidKey} {
		if e := log.last(id); e.Type != adapter.EventDeadLettered || !errors.Is(e.Err, want) {
			t.Errorf("message %q settled %v with %v, want dead-lettered with %v", id, e.Type, e.Err, want)
		}
	}

	// The three are in the dead-letter queue, rejected, bodies intact.
	ch := openChannel(t, admin)
	defer ch.Close()
	bodies := map[string]bool{}
	for range 3 {
		var d amqp.Delivery
		var ok bool
		var err error
		for deadline := time.Now().Add(10 * time.Second); !ok && time.Now().Before(deadline); {
			if d, ok, err = ch.Get(top.dlq, true); err != nil {
				t.Fatal(err)
			} else if !ok {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if !ok {
			t.Fatalf("dead-letter queue has fewer than 3 messages (got %d)", len(bodies))
		}
		deaths, _ := d.Headers["x-death"].([]any)
		if len(deaths) != 1 || deaths[0].(amqp.Table)["reason"] != "rejected" || deaths[0].(amqp.Table)["queue"] != top.queue {
			t.Fatalf("dead letter %q has x-death %v, want one rejection from %s", d.MessageId, d.Headers["x-death"], top.queue)
		}
		bodies[string(d.Body)] = true
	}
	if !bodies[string(badBody.Body)] || !bodies[string(noKey.Body)] || !bodies[string(nulKey.Body)] {
		t.Fatalf("dead-letter bodies %v, want the three poison messages", bodies)
	}
	if n := depth(t, admin, top.dlq); n != 0 {
		t.Fatalf("%d extra messages in the dead-letter queue", n)
	}
	// Nothing of the poison was written: one claim, one credit.
	var claims int
	if err := db.QueryRow("SELECT count(*) FROM " + pq.QuoteIdentifier(l.schema) + ".processed_messages").Scan(&claims); err != nil {
		t.Fatal(err)
	}
	if b := l.balance(t, 3); claims != 1 || b != good.Points {
		t.Fatalf("%d claims and balance %d, want 1 claim and %d points", claims, b, good.Points)
	}
	if n := depth(t, admin, top.queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}

func TestRabbitMQFailedDeliveryIsRequeuedThenApplied(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	db := openDB(t, 4)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	msg := order{OrderID: 77, CustomerID: 9, Points: 42}
	newPublisher(t, admin, top.queue).publish(t, orderMessage(t, msg))

	// The first two attempts fail inside the transaction (say, a pricing
	// lookup timing out): the claim rolls back with the effect.
	var attempts atomic.Int32
	var redelivered atomic.Bool
	h := rabbitmq.Decode(rabbitmq.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, d *amqp.Delivery) error {
		if err := l.credit(ctx, tx, o); err != nil {
			return err
		}
		if attempts.Add(1) <= 2 {
			return errors.New("pricing service timed out")
		}
		redelivered.Store(d.Redelivered)
		return nil
	})
	c, err := rabbitmq.NewConsumer(l.mw, h, rabbitmq.WithRetryDelay(20*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := runUntil(t, c, dialTest(t, url), top.queue, "the ack", func() bool { return c.Stats().Applied == 1 }); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Requeued != 2 || s.Applied != 1 || s.DeadLettered != 0 || !redelivered.Load() {
		t.Fatalf("stats %+v (redelivered %v), want 2 requeues then 1 applied, redelivered", s, redelivered.Load())
	}
	if b, n := l.balance(t, 9), l.ledgerRows(t, 77); b != msg.Points || n != 1 {
		t.Fatalf("balance %d with %d ledger rows, want %d with 1", b, n, msg.Points)
	}
}

func TestRabbitMQShutdownLosesNothingInFlight(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	db := openDB(t, 6)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)
	const orders = 300
	var msgs []amqp.Publishing
	want := map[int64]int64{}
	for i := int64(1); i <= orders; i++ {
		o := order{OrderID: i, CustomerID: 1 + i%20, Points: 1 + i%37}
		want[o.CustomerID] += o.Points
		msgs = append(msgs, orderMessage(t, o))
	}
	newPublisher(t, admin, top.queue).publish(t, msgs...)

	// Slow handlers keep several deliveries in flight, and more prefetched,
	// when the shutdown comes.
	h := rabbitmq.Decode(rabbitmq.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *amqp.Delivery) error {
		time.Sleep(3 * time.Millisecond)
		return l.credit(ctx, tx, o)
	})
	first, err := rabbitmq.NewConsumer(l.mw, h, rabbitmq.WithWorkers(4), rabbitmq.WithPrefetch(20))
	if err != nil {
		t.Fatal(err)
	}
	conn := dialTest(t, url)
	if err := runUntil(t, first, conn, top.queue, "100 acks", func() bool { return first.Stats().Applied >= 100 }); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	s1 := first.Stats()
	if s1.SettleFailed != 0 || s1.Requeued != 0 || s1.Duplicates != 0 {
		t.Fatalf("first consumer %+v: every delivery it applied must be acked by the time Run returns", s1)
	}
	_ = conn.Close() // anything left unacked would go back to the queue now

	// A second consumer drains the rest. Had the first lost an in-flight
	// ack, its message would come back here as a duplicate.
	second, err := rabbitmq.NewConsumer(l.mw, h, rabbitmq.WithWorkers(4))
	if err != nil {
		t.Fatal(err)
	}
	if err := runUntil(t, second, dialTest(t, url), top.queue, "the rest", func() bool { return first.Stats().Applied+second.Stats().Applied >= orders }); err != nil {
		t.Fatal(err)
	}
	s2 := second.Stats()
	if s2.Duplicates != 0 || s2.SettleFailed != 0 || s1.Applied+s2.Applied != orders {
		t.Fatalf("first %+v, second %+v: want %d applied and acked once in all, no duplicates", s1, s2, orders)
	}
	t.Logf("shutdown after %d acks released %d prefetched deliveries", s1.Applied, s1.Released)
	for c, points := range want {
		if b := l.balance(t, c); b != points {
			t.Fatalf("customer %d: balance %d, want %d", c, b, points)
		}
	}
	if n := depth(t, admin, top.queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}

// TestRabbitMQFiveThousandWithCrashes runs 5,000 orders (a tenth published
// twice, back to back, as a producer retrying a lost confirm does, plus a few
// without a key) through four consumer processes whose connections are
// closed abruptly at random: right after a commit, before the ack, and at
// random moments mid-stream. Every balance must end exact, every order credited once,
// every good message acked, every keyless one dead-lettered.
func TestRabbitMQFiveThousandWithCrashes(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	db := openDB(t, 12)
	l := newLoyalty(t, db)
	top := declareTopology(t, url)
	admin := dialTest(t, url)

	const orders, poison, processes, workers = 5000, 10, 4, 3
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[int64]int64{}
	var msgs []amqp.Publishing
	copies := 0
	for i := int64(1); i <= orders; i++ {
		o := order{OrderID: i, CustomerID: 1 + rng.Int64N(100), Points: 1 + rng.Int64N(200)}
		want[o.CustomerID] += o.Points
		m := orderMessage(t, o)
		n := 1
		if rng.IntN(10) == 0 {
			n = 2
		}
		for range n {
			copies++
			m.Headers = amqp.Table{"copy": int64(copies)}
			msgs = append(msgs, m)
		}
		if i%(orders/poison) == 0 {
			bad := orderMessage(t, order{OrderID: -i, CustomerID: 1, Points: 1})
			bad.MessageId = ""
			copies++
			bad.Headers = amqp.Table{"copy": int64(copies)}
			msgs = append(msgs, bad)
		}
	}
	newPublisher(t, admin, top.queue).publish(t, msgs...)

	var mu sync.Mutex
	acked := map[int64]int{} // copy -> successful acks
	deadLettered := map[int64]int{}
	// A settlement that could not be sent is reported right after it, on
	// the same goroutine: it takes the count back.
	last := map[*amqp.Delivery]map[int64]int{}
	observer := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
		d := e.Detail.(*amqp.Delivery)
		id, _ := d.Headers["copy"].(int64)
		mu.Lock()
		defer mu.Unlock()
		switch e.Type {
		case adapter.EventApplied, adapter.EventDuplicate:
			acked[id]++
			last[d] = acked
		case adapter.EventDeadLettered:
			deadLettered[id]++
			last[d] = deadLettered
		case adapter.EventSettleFailed:
			if m := last[d]; m != nil {
				if m[id]--; m[id] == 0 {
					delete(m, id)
				}
			}
		}
	})
	settled := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) + len(deadLettered)
	}

	var crashes, kills, runs atomic.Int64
	var live sync.Map // *process -> struct{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for i := range processes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prng := rand.New(rand.NewPCG(uint64(i), 7))
			var prngMu sync.Mutex
			for ctx.Err() == nil {
				p, err := dialProcess(url)
				if err != nil {
					t.Errorf("process %d: dial: %v", i, err)
					return
				}
				live.Store(p, struct{}{})
				crashBeforeAck := func(*amqp.Delivery) {
					prngMu.Lock()
					crash := prng.IntN(150) == 0
					prngMu.Unlock()
					if crash { // committed, not yet acked
						crashes.Add(1)
						p.crash()
					}
				}
				c, err := rabbitmq.NewConsumer(l.mw, l.orderHandler(), rabbitmq.WithWorkers(workers),
					rabbitmq.WithRetryDelay(10*time.Millisecond, 10*time.Millisecond), rabbitmq.WithObserver(observer))
				if err != nil {
					t.Error(err)
					return
				}
				runs.Add(1)
				err = func() error {
					ch, err := p.conn.Channel()
					if err != nil {
						return err
					}
					return c.Run(ctx, &ackHookChannel{Channel: ch, before: crashBeforeAck}, top.queue)
				}()
				live.Delete(p)
				if err != nil && !p.crashed.Load() {
					t.Errorf("process %d: Run: %v", i, err)
				}
				_ = p.conn.Close()
			}
		}()
	}
	// Mid-stream crashes, until three quarters of the copies are settled.
	wg.Add(1)
	go func() {
		defer wg.Done()
		krng := rand.New(rand.NewPCG(3, 4))
		for ctx.Err() == nil && settled() < copies*3/4 {
			time.Sleep(time.Duration(50+krng.IntN(150)) * time.Millisecond)
			live.Range(func(k, _ any) bool {
				if krng.IntN(processes) == 0 {
					kills.Add(1)
					k.(*process).crash()
					return false
				}
				return true
			})
		}
	}()

	deadline := time.Now().Add(3 * time.Minute)
	for settled() < copies || depth(t, admin, top.queue) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %d of %d copies settled", settled(), copies)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	wg.Wait()
	t.Logf("%d copies of %d orders and %d poison messages: %d crashes after commit, %d mid-stream crashes, %d consumer runs",
		copies, orders, poison, crashes.Load(), kills.Load(), runs.Load())
	if crashes.Load() == 0 || kills.Load() == 0 {
		t.Fatalf("no faults injected (crashes after commit %d, mid-stream %d)", crashes.Load(), kills.Load())
	}

	if n := depth(t, admin, top.queue); n != 0 {
		t.Fatalf("%d messages left in the queue after every consumer stopped", n)
	}
	if n := depth(t, admin, top.dlq); n != poison || len(deadLettered) != poison {
		t.Fatalf("dead-letter queue holds %d (%d rejected), want exactly the %d poison messages", n, len(deadLettered), poison)
	}
	twice := 0
	for _, n := range acked {
		if n > 1 {
			twice++
		}
	}
	if len(acked) != copies-poison {
		t.Fatalf("%d copies acked, want %d", len(acked), copies-poison)
	}
	// An ack the client sent just before its socket closed can be lost
	// in flight; the broker then redelivers, and the claim makes it a
	// duplicate. The broker holds nothing at the end either way.
	t.Logf("%d copies acked twice because an ack was lost with its connection", twice)

	q := pq.QuoteIdentifier(l.schema)
	var ledgerRows, orderIDs int
	if err := db.QueryRow("SELECT count(*), count(DISTINCT order_id) FROM "+q+".point_ledger").Scan(&ledgerRows, &orderIDs); err != nil {
		t.Fatal(err)
	}
	if ledgerRows != orders || orderIDs != orders {
		t.Fatalf("%d ledger rows for %d orders, want %d each credited once", ledgerRows, orderIDs, orders)
	}
	for c := int64(1); c <= 100; c++ {
		if b := l.balance(t, c); b != want[c] {
			t.Fatalf("customer %d: balance %d, want %d", c, b, want[c])
		}
	}
}
