package redisstream_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/redisstream"
)

// TestSenderResendIsDuplicate: a relay whose first send of every row
// "fails" after Redis stored it sends each row again, adding a second
// entry; each entry carries the row's idempotency key, its event time (or
// CreatedAt) and its payload, and a Consumer downstream applies each row
// once, the second entry a Duplicate.
func TestSenderResendIsDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.OpenPostgres(t, 4)
	l := newLedger(t, db, "points")
	ob := l.outbox(t)
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	orders := testenv.MakeOrders(6)
	at := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	eventTimes := map[string]time.Time{} // idempotency key → event time enqueued, zero for none
	for i, o := range orders {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var opts []outbox.EnqueueOption
		if i%2 == 0 {
			opts = append(opts, outbox.WithEventTime(at))
		}
		k, err := ob.Enqueue(ctx, tx, o.Key(), "points_awarded", []byte(mustJSON(t, o)), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			eventTimes[k] = at
		} else {
			eventTimes[k] = time.Time{}
		}
	}
	s, err := redisstream.NewSender(rdb, func(outbox.Message) string { return stream })
	if err != nil {
		t.Fatal(err)
	}
	lossy := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if err := s.Send(ctx, m); err != nil {
			return err
		}
		if m.Attempt == 1 {
			return errors.New("reply lost: connection reset")
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
	waitFor(t, 20*time.Second, "every row sent", func() bool {
		st, err := ob.Stats(ctx)
		return err == nil && st.Pending == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2*len(orders) {
		t.Fatalf("the stream holds %d entries, want %d: two per row", len(entries), 2*len(orders))
	}
	for _, e := range entries {
		k, _ := e.Values[redisstream.DefaultKeyField].(string)
		want, ok := eventTimes[k]
		if !ok {
			t.Fatalf("entry %s has key %q, not a row's idempotency key", e.ID, k)
		}
		got, err := adapter.ParseEventTime(fmt.Sprint(e.Values[adapter.EventTimeHeader]))
		if err != nil || got.IsZero() || (!want.IsZero() && !got.Equal(want)) {
			t.Fatalf("entry %s event time %v (%v), want %v (or the row's CreatedAt when zero)", e.ID, got, err, want)
		}
	}

	c, err := redisstream.NewConsumer(l.mw, l.handler(), redisstream.WithBlock(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "every entry settled", func() bool {
		st := c.Stats()
		return st.Applied+st.Duplicates == int64(2*len(orders))
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Applied != int64(len(orders)) || st.Duplicates != int64(len(orders)) {
		t.Fatalf("stats %+v, want each row applied once and its re-send a duplicate", st)
	}
	testenv.AuditOrders(t, l.db, l.schema, orders)
}

func TestNewSenderRefusesNil(t *testing.T) {
	if _, err := redisstream.NewSender(nil, func(outbox.Message) string { return "s" }); err == nil {
		t.Fatal("NewSender accepted a nil client")
	}
	if _, err := redisstream.NewSender(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), nil); err == nil {
		t.Fatal("NewSender accepted a nil stream function")
	}
	s, err := redisstream.NewSender(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), func(outbox.Message) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	// An empty stream name is permanent: the relay marks the row dead at
	// once, nothing sent.
	if err := s.Send(context.Background(), outbox.Message{ID: 1, Kind: "k"}); !errors.Is(err, outbox.ErrPermanent) {
		t.Fatalf("Send with no stream: %v", err)
	}
}
