package watermill_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
	idwm "github.com/txclaim/idempotent/watermill"

	"github.com/txclaim/idempotent/internal/testenv"
)

// settled is a router middleware, outermost, that counts how handlers
// returned: nil (the router acks) or an error (it nacks).
type settled struct{ acked, nacked atomic.Int64 }

func (s *settled) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			s.nacked.Add(1)
		} else {
			s.acked.Add(1)
		}
		return out, err
	}
}

// loseFirstAck is a router middleware, outside the idempotent one, that
// turns the first successful return into a failure: the effect has
// committed, but the ack never reaches the broker — the router nacks, and
// the broker delivers the message again.
func loseFirstAck() message.HandlerMiddleware {
	var lost atomic.Bool
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && lost.CompareAndSwap(false, true) {
				return nil, errors.New("connection lost before the ack")
			}
			return out, err
		}
	}
}

func newGoChannel(t testing.TB) *gochannel.GoChannel {
	t.Helper()
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64, Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubsub.Close() })
	return pubsub
}

func TestGoChannelAckLostAfterCommitIsDuplicate(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	pubsub := newGoChannel(t)
	r := newRouter(t)
	var s settled
	r.AddMiddleware(s.middleware, loseFirstAck())
	r.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, l, l.handler(nil)))
	runRouter(t, r)
	o := order{OrderID: 9912, CustomerID: 7, Points: 50}
	if err := pubsub.Publish("orders", orderMessage(t, o)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the redelivery's ack", func() (bool, error) { return s.acked.Load() == 1, nil })
	if a, d, n := l.counts.Applied(), l.counts.Duplicates(), s.nacked.Load(); a != 1 || d != 1 || n != 1 {
		t.Fatalf("applied %d, duplicates %d, nacks %d: want the first delivery applied (its ack lost) and the redelivery a duplicate", a, d, n)
	}
	l.audit(t, []order{o})
}

// TestFailOnceThenSucceedDeduplicatorLosesItOursAppliesOnce runs, side by
// side, a handler that fails on its first attempt under Watermill's own
// middleware.Deduplicator and under this middleware. The Deduplicator marks
// the message seen before the handler runs and never unmarks it, so the
// redelivery of the failed message is dropped as a duplicate and the effect
// is lost; this middleware's claim rolls back with the failure, so the
// redelivery applies it, once.
func TestFailOnceThenSucceedDeduplicatorLosesItOursAppliesOnce(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 4)
	theirs := newLedger(t, db, "dedup")
	mine := newLedger(t, db, "loyalty")
	pubsub := newGoChannel(t)
	o := order{OrderID: 77, CustomerID: 9, Points: 42}
	fails := func(order) bool { return true }

	// Watermill's Deduplicator, with a transactional handler of the same
	// effect: the failure rolls the effect back.
	var theirsSettled settled
	r1 := newRouter(t)
	seen := newOnce()
	h1 := r1.AddConsumerHandler("dedup", "orders", pubsub, func(msg *message.Message) error {
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return err
		}
		tx, err := db.BeginTx(msg.Context(), nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := theirs.credit(msg.Context(), tx, o); err != nil {
			return err
		}
		if fails(o) && seen.first(o.OrderID) {
			return fmt.Errorf("order %d: pricing service timed out", o.OrderID)
		}
		return tx.Commit()
	})
	h1.AddMiddleware(theirsSettled.middleware, (&middleware.Deduplicator{}).Middleware)
	runRouter(t, r1)

	var oursSettled settled
	r2 := newRouter(t)
	h2 := r2.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, mine, mine.handler(fails)))
	h2.AddMiddleware(oursSettled.middleware)
	runRouter(t, r2)

	if err := pubsub.Publish("orders", orderMessage(t, o)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both acks", func() (bool, error) {
		return theirsSettled.acked.Load() == 1 && oursSettled.acked.Load() == 1, nil
	})
	if n := theirsSettled.nacked.Load(); n != 1 {
		t.Fatalf("Deduplicator side: %d nacks, want 1", n)
	}
	if n := theirs.count(t, "SELECT count(*) FROM $S.point_ledger"); n != 0 {
		t.Fatalf("Deduplicator side: %d ledger rows; the redelivery should have been dropped as a duplicate", n)
	}
	t.Logf("Watermill's Deduplicator: 1 failure, redelivery dropped as a duplicate, effect lost (0 ledger rows)")
	if n := oursSettled.nacked.Load(); n != 1 || mine.counts.Applied() != 1 || mine.counts.Duplicates() != 0 {
		t.Fatalf("idempotent side: %d nacks, %d applied, %d duplicates: want 1, 1, 0", n, mine.counts.Applied(), mine.counts.Duplicates())
	}
	mine.audit(t, []order{o})
}

func TestGoChannelAuditWithDuplicatesAndFailures(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	pubsub := newGoChannel(t)
	r := newRouter(t)
	var s settled
	r.AddMiddleware(s.middleware)
	// Every 13th order fails on its first attempt.
	r.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, l, l.handler(func(o order) bool { return o.OrderID%13 == 0 })))
	runRouter(t, r)
	orders := testenv.MakeOrders(2000)
	msgs := withDuplicates(t, orders)
	if err := pubsub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
	waitWhileProgressing(t, time.Minute, "every message acked", s.acked.Load, nil, func() (bool, error) { return s.acked.Load() == int64(len(msgs)), nil })
	fails := int64(2000 / 13)
	t.Logf("%d messages (2000 orders, %d published twice), %d first attempts failed: %d applied, %d duplicates",
		len(msgs), len(msgs)-2000, s.nacked.Load(), l.counts.Applied(), l.counts.Duplicates())
	if l.counts.Applied() != 2000 || l.counts.Duplicates() != int64(len(msgs)-2000) || s.nacked.Load() != fails {
		t.Errorf("applied %d, duplicates %d, nacks %d: want 2000, %d, %d", l.counts.Applied(), l.counts.Duplicates(), s.nacked.Load(), len(msgs)-2000, fails)
	}
	l.audit(t, orders)
}

// TestMessageWithoutKeyIsPoisonAndWritesNothing keys by a metadata field
// (Header(KeyMetadata)), the producer minting a fresh UUID per publish: a
// message without the field goes to the poison topic once, nothing
// written, and a good one's re-publish under another UUID is a duplicate.
func TestMessageWithoutKeyIsPoisonAndWritesNothing(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	pubsub := newGoChannel(t)
	r := newRouter(t)
	poisonQ, err := middleware.PoisonQueueWithFilter(pubsub, "orders.poison", adapter.IsPoison)
	if err != nil {
		t.Fatal(err)
	}
	var s settled
	var c adapter.Counter
	r.AddMiddleware(s.middleware, poisonQ)
	r.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, l, l.handler(nil), idwm.WithKey(idwm.Header(idwm.KeyMetadata)), idwm.WithObserver(&c)))
	runRouter(t, r)
	poisoned, err := pubsub.Subscribe(context.Background(), "orders.poison")
	if err != nil {
		t.Fatal(err)
	}
	good := order{OrderID: 1, CustomerID: 1, Points: 5}
	noKey := keyedMessage(t, order{OrderID: 2, CustomerID: 1, Points: 5})
	noKey.Metadata = message.Metadata{}
	if err := pubsub.Publish("orders", noKey, keyedMessage(t, good), keyedMessage(t, good)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-poisoned:
		m.Ack()
		if m.UUID != noKey.UUID || m.Metadata.Get(middleware.ReasonForPoisonedKey) == "" {
			t.Fatalf("poison topic got %s (reason %q), want %s with a reason", m.UUID, m.Metadata.Get(middleware.ReasonForPoisonedKey), noKey.UUID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no message on the poison topic")
	}
	waitFor(t, 30*time.Second, "all three acked", func() (bool, error) { return s.acked.Load() == 3, nil })
	if st := c.Stats(); st.Applied != 1 || st.Duplicates != 1 || st.DeadLettered != 1 || st.Requeued != 0 {
		t.Fatalf("stats %+v: want 1 applied, 1 duplicate, 1 dead-lettered", st)
	}
	l.audit(t, []order{good})
}

// TestProducedMessagesGoThroughTheOutbox has the handler write an event per
// order with an Outbox, in the claim's transaction; a Sender relays them
// with a stable identity, so a downstream consumer applies each once, even
// though the first ack of every order is lost and the relay's first
// publish of every row is reported as failed after it went out. Every
// publish of a row carries the same event time: the one the handler set,
// or else the time the row was written.
func TestProducedMessagesGoThroughTheOutbox(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 8)
	l := newLedger(t, db, "loyalty")
	down := newLedger(t, db, "notifier")
	ob, err := outbox.New(db, "loyalty", outbox.WithTable(l.schema+".outbox"), outbox.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	awards, err := idwm.NewOutbox(ob, "points_awarded")
	if err != nil {
		t.Fatal(err)
	}
	pubsub := newGoChannel(t)

	// Even orders' awards carry the event time of their own; odd ones get
	// the row's.
	awardedAt := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	produce := idwm.Decode(idwm.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, msg *message.Message) error {
		if err := l.credit(ctx, tx, o); err != nil {
			return err
		}
		award := order{OrderID: o.OrderID, CustomerID: o.CustomerID, Points: 2 * o.Points}
		b, err := json.Marshal(award)
		if err != nil {
			return err
		}
		p := message.NewMessage(watermill.NewUUID(), b)
		if o.OrderID%2 == 0 {
			p.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(awardedAt))
		}
		return awards.Publish(ctx, tx, msg, p)
	})

	r := newRouter(t)
	var s settled
	h := r.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, l, produce))
	h.AddMiddleware(s.middleware, loseFirstAck())
	var downSettled settled
	// published records, per award's UUID, its order and the event
	// times it was published with.
	type published struct {
		orderID int64
		times   map[string]bool
	}
	var mu sync.Mutex
	seen := map[string]*published{}
	hd := r.AddConsumerHandler("notifier", "points", pubsub, ours(t, down, down.handler(nil)))
	hd.AddMiddleware(downSettled.middleware, func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			var o order
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return nil, err
			}
			mu.Lock()
			p := seen[msg.UUID]
			if p == nil {
				p = &published{orderID: o.OrderID, times: map[string]bool{}}
				seen[msg.UUID] = p
			}
			p.times[msg.Metadata.Get(adapter.EventTimeHeader)] = true
			mu.Unlock()
			return h(msg)
		}
	})
	runRouter(t, r)

	var failedOnce sync.Map
	sender := idwm.NewSender(pubsub, "points")
	lossy := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if err := sender.Send(ctx, m); err != nil {
			return err
		}
		if _, again := failedOnce.LoadOrStore(m.ID, true); !again {
			return errors.New("publish confirmation lost")
		}
		return nil
	})
	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", lossy), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithBackoff(outbox.Backoff{Initial: 5 * time.Millisecond, Max: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()

	orders := testenv.MakeOrders(50)
	var msgs []*message.Message
	for _, o := range orders {
		msgs = append(msgs, orderMessage(t, o))
	}
	if err := pubsub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "every award applied downstream", func() (bool, error) {
		st, err := ob.Stats(ctx)
		return err == nil && st.Pending == 0 && s.acked.Load() == int64(len(orders)) && downSettled.acked.Load() == int64(2*len(orders)), err
	})
	cancel()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}
	l.audit(t, orders)
	var awardsWant []order
	for _, o := range orders {
		awardsWant = append(awardsWant, order{OrderID: o.OrderID, CustomerID: o.CustomerID, Points: 2 * o.Points})
	}
	if down.counts.Applied() != int64(len(orders)) || down.counts.Duplicates() != int64(len(orders)) {
		t.Errorf("downstream applied %d and found %d duplicates, want %d each (every row was published twice)", down.counts.Applied(), down.counts.Duplicates(), len(orders))
	}
	down.audit(t, awardsWant)
	// Each award was published twice, with one event time: its own for
	// the even orders, the row's for the odd ones.
	rows := map[string]time.Time{}
	rs, err := db.QueryContext(ctx, "SELECT idempotency_key, created_at FROM "+pq.QuoteIdentifier(l.schema)+".outbox")
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var k string
		var at time.Time
		if err := rs.Scan(&k, &at); err != nil {
			t.Fatal(err)
		}
		rows[k] = at
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != len(orders) {
		t.Errorf("%d awards published, want %d", len(seen), len(orders))
	}
	for key, p := range seen {
		created, ok := rows[key]
		if !ok {
			t.Errorf("award %s published, but no outbox row has that key", key)
			continue
		}
		want := created
		if p.orderID%2 == 0 {
			want = awardedAt
		}
		if len(p.times) != 1 || !p.times[adapter.FormatEventTime(want)] {
			t.Errorf("award of order %d published with event times %v, want %s on every publish", p.orderID, p.times, adapter.FormatEventTime(want))
		}
	}
}
