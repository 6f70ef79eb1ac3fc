package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/outbox"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
)

// TestOutboxSenderRetryAfterLostPubAckIsDroppedByTheStream relays outbox
// rows to JetStream through a Sender whose first PubAck of every call is
// lost (the stream stored the message, the relay saw an error): the relay
// publishes again with the same Nats-Msg-Id, the stream answers Duplicate,
// and it holds each call once.
func TestOutboxSenderRetryAfterLostPubAckIsDroppedByTheStream(t *testing.T) {
	t.Parallel()
	nc := localNATS(t)
	js := newJS(t, nc)
	_, stream := newStream(t, js, 1)
	db := testenv.OpenPostgres(t, 6)
	l := newLedger(t, db, "loyalty")
	ob, err := outbox.New(db, "loyalty", outbox.WithTable(l.schema+".outbox"), outbox.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}

	// The handler credits the order and enqueues a points-awarded event in
	// the claim's transaction: with the order's event time for the even
	// orders, without one for the odd.
	orders := testenv.MakeOrders(40)
	keys := map[string]bool{}
	eventTimes := map[string]time.Time{} // idempotency key -> the event time enqueued
	for i, o := range orders {
		msg := idempotent.Message{Key: o.Key()}
		if i%2 == 0 {
			msg.EventTime = time.Now().Add(-time.Duration(i+1) * time.Hour).Truncate(time.Microsecond)
		}
		_, err := l.mw.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			if err := l.credit(ctx, tx, o); err != nil {
				return err
			}
			var opts []outbox.EnqueueOption
			if !msg.EventTime.IsZero() {
				opts = append(opts, outbox.WithEventTime(msg.EventTime))
			}
			k, err := ob.Enqueue(ctx, tx, o.Key(), "points_awarded", mustJSON(t, o), opts...)
			keys[k] = true
			eventTimes[k] = msg.EventTime
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	acks := map[string][]bool{}       // idempotency key -> PubAck.Duplicate of each publish
	created := map[string]time.Time{} // idempotency key -> the row's CreatedAt
	sender, err := idnats.NewSender(js, func(outbox.Message) string { return stream + ".points" },
		idnats.WithPubAck(func(m outbox.Message, ack *jetstream.PubAck) {
			mu.Lock()
			acks[m.IdempotencyKey] = append(acks[m.IdempotencyKey], ack.Duplicate)
			created[m.IdempotencyKey] = m.CreatedAt
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	lossy := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if err := sender.Send(ctx, m); err != nil {
			return err
		}
		if m.Attempt == 1 {
			return errors.New("PubAck lost: connection reset")
		}
		return nil
	})
	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", lossy), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithBackoff(outbox.Backoff{Initial: 5 * time.Millisecond, Max: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	waitFor(t, 30*time.Second, "every row sent", func() (bool, error) {
		s, err := ob.Stats(ctx)
		return err == nil && s.Pending == 0, err
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	for k := range keys {
		if fmt.Sprint(acks[k]) != "[false true]" {
			t.Errorf("call %s: PubAck duplicates %v, want [false true] (stored, then dropped as a duplicate)", k, acks[k])
		}
	}
	mu.Unlock()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(orders)) {
		t.Fatalf("the stream holds %d messages, want %d: one per outbox row", info.State.Msgs, len(orders))
	}
	// Each stored message carries its row's idempotency key, and the event
	// time it was enqueued with, or else its row's CreatedAt.
	cons := newConsumer(t, s, "points", 30*time.Second)
	batch, err := cons.Fetch(len(orders), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for m := range batch.Messages() {
		k := m.Headers().Get(jetstream.MsgIDHeader)
		seen[k] = true
		want := eventTimes[k]
		if want.IsZero() {
			want = created[k]
		}
		at, err := adapter.ParseEventTime(m.Headers().Get(adapter.EventTimeHeader))
		if err != nil || at.IsZero() || !at.Equal(want) {
			t.Errorf("call %s: event time header %q (%v), want %v (enqueued with %v, created %v)", k, m.Headers().Get(adapter.EventTimeHeader), err, want, eventTimes[k], created[k])
		}
	}
	if len(seen) != len(keys) {
		t.Fatalf("%d distinct Nats-Msg-Id values in the stream, want %d", len(seen), len(keys))
	}
	for k := range keys {
		if !seen[k] {
			t.Errorf("no message with Nats-Msg-Id %s", k)
		}
	}
}
