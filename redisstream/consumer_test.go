package redisstream_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/redisstream"
)

const group = "loyalty"

// pending is how many entries of stream the group has delivered and not
// had acknowledged.
func pending(t testing.TB, rdb *redis.Client, stream string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// delivered is the id of the last entry of stream the group has read.
func delivered(t testing.TB, rdb *redis.Client, stream string) string {
	t.Helper()
	gs, err := rdb.XInfoGroups(context.Background(), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		if g.Name == group {
			return g.LastDeliveredID
		}
	}
	t.Fatalf("no group %q on %s", group, stream)
	return ""
}

// TestCrashAfterCommitReclaimed: a consumer whose XACK is lost after its
// commit, and which then dies, leaves the entry pending; another consumer
// of the group re-claims it with XAUTOCLAIM after the claim idle bound,
// and the claim makes it a Duplicate: one effect, on the second delivery
// count.
func TestCrashAfterCommitReclaimed(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	admin := newClient(t, redisAddr())
	stream := newStream(t, admin, group)
	o := testenv.MakeOrders(1)[0]
	id := publish(t, admin, stream, o, time.Now().Add(-time.Minute))

	var lost atomic.Bool
	dying := newClient(t, redisAddr(), loseAcks{lose: func(string) bool { lost.Store(true); return true }})
	var ev1 events
	c1, err := redisstream.NewConsumer(l.mw, l.handler(), redisstream.WithObserver(&ev1), redisstream.WithBlock(20*time.Millisecond),
		redisstream.WithClaimIdle(200*time.Millisecond), redisstream.WithConsumerName("dying"))
	if err != nil {
		t.Fatal(err)
	}
	r1 := start(c1, dying, stream, group)
	waitFor(t, 10*time.Second, "the first delivery applied", func() bool { return len(ev1.of(adapter.EventApplied)) == 1 })
	if !lost.Load() {
		t.Fatal("the XACK was not sent")
	}
	_ = dying.Close() // the crash
	if err := r1.wait(t); !errors.Is(err, redisstream.ErrClientClosed) {
		t.Fatalf("Run after its client closed: %v, want ErrClientClosed", err)
	}
	if n := pending(t, admin, stream); n != 1 {
		t.Fatalf("%d entries pending after the crash, want 1", n)
	}

	var ev2 events
	c2, err := redisstream.NewConsumer(l.mw, l.handler(), redisstream.WithObserver(&ev2), redisstream.WithBlock(20*time.Millisecond),
		redisstream.WithClaimIdle(200*time.Millisecond), redisstream.WithConsumerName("heir"))
	if err != nil {
		t.Fatal(err)
	}
	r2 := start(c2, newClient(t, redisAddr()), stream, group)
	waitFor(t, 10*time.Second, "the re-claimed delivery settled", func() bool { return c2.Stats().Duplicates+c2.Stats().Applied > 0 })
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
	dups := ev2.of(adapter.EventDuplicate)
	if len(dups) != 1 || c2.Stats().Applied != 0 {
		t.Fatalf("the heir's stats %+v, want one duplicate", c2.Stats())
	}
	d := dups[0].Detail.(*redisstream.Delivery)
	if d.ID != id || d.Count != 2 || dups[0].Attempt != 2 || dups[0].Message.Key != o.Key() {
		t.Fatalf("the duplicate's delivery %+v (attempt %d, key %q), want entry %s on its second delivery", d, dups[0].Attempt, dups[0].Message.Key, id)
	}
	if n := pending(t, admin, stream); n != 0 {
		t.Fatalf("%d entries pending, want 0", n)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// TestRequeueDelayHonoured: an entry whose handler fails is left pending
// and read again, by the same consumer, no sooner than the rule's delay;
// the second delivery counts 2.
func TestRequeueDelayHonoured(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	o := testenv.MakeOrders(1)[0]
	publish(t, rdb, stream, o, time.Now().Add(-time.Minute))

	var failed atomic.Bool
	var ev events
	var requeuedAt, appliedAt atomic.Int64
	obs := adapter.ObserverFunc(func(ctx context.Context, e adapter.Event) {
		switch e.Type {
		case adapter.EventRequeued:
			requeuedAt.Store(time.Now().UnixNano())
		case adapter.EventApplied:
			appliedAt.Store(time.Now().UnixNano())
		}
		ev.Observe(ctx, e)
	})
	h := redisstream.Decode(redisstream.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, d *redisstream.Delivery) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("the ledger service is restarting")
		}
		return testenv.Credit(ctx, tx, l.schema, o)
	})
	c, err := redisstream.NewConsumer(l.mw, h, redisstream.WithObserver(obs), redisstream.WithBlock(20*time.Millisecond),
		redisstream.WithRetryDelay(300*time.Millisecond, 300*time.Millisecond), redisstream.WithClaimIdle(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "the entry applied", func() bool { return c.Stats().Applied == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	req := ev.of(adapter.EventRequeued)
	app := ev.of(adapter.EventApplied)
	if len(req) != 1 || len(app) != 1 || req[0].Attempt != 1 || app[0].Attempt != 2 {
		t.Fatalf("requeued %v, applied %v: want one requeue on attempt 1, then applied on attempt 2", req, app)
	}
	if req[0].Delay < 150*time.Millisecond || req[0].Delay > 300*time.Millisecond {
		t.Fatalf("requeue delay %v, want the rule's, 150ms to 300ms", req[0].Delay)
	}
	if waited := time.Duration(appliedAt.Load() - requeuedAt.Load()); waited < req[0].Delay {
		t.Fatalf("read again %v after the requeue, sooner than its delay %v", waited, req[0].Delay)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// TestMaxDeliveriesDropped: an entry whose handler always fails is
// requeued until its delivery count reaches the bound, then acknowledged
// and dropped, reported once as dead-lettered with ErrMaxDeliveries.
func TestMaxDeliveriesDropped(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	publish(t, rdb, stream, testenv.MakeOrders(1)[0], time.Now().Add(-time.Minute))
	var ev events
	c, err := redisstream.NewConsumer(l.mw, func(context.Context, *sql.Tx, *redisstream.Delivery) error {
		return errors.New("the ledger service is down")
	}, redisstream.WithObserver(&ev), redisstream.WithBlock(20*time.Millisecond), redisstream.WithMaxDeliveries(3),
		redisstream.WithRetryDelay(5*time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "the entry dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if s.Requeued != 2 || s.DeadLettered != 1 || s.Applied != 0 {
		t.Fatalf("stats %+v, want 2 requeues then one dead letter", s)
	}
	dl := ev.of(adapter.EventDeadLettered)[0]
	if !errors.Is(dl.Err, redisstream.ErrMaxDeliveries) || !errors.Is(dl.Err, adapter.ErrPoison) {
		t.Fatalf("dead letter's error %v, want ErrMaxDeliveries", dl.Err)
	}
	if dropped, ok := dl.Detail.(redisstream.Dropped); !ok || dropped.Delivery.Count != 3 {
		t.Fatalf("dead letter's Detail %#v, want a Dropped on its third delivery", dl.Detail)
	}
	if n := pending(t, rdb, stream); n != 0 {
		t.Fatalf("%d entries pending, want 0: a dropped entry is acknowledged", n)
	}
}

// TestDeadLetterStream: a poison entry goes through the outbox to the
// dead-letter stream, with its fields, the event time it was read with,
// the dead-letter fields, and is acknowledged; nothing of its effect is
// written.
func TestDeadLetterStream(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 4)
	l := newLedger(t, db, "loyalty")
	ctx := context.Background()
	ob := l.outbox(t)
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	dead := deadStream(t, rdb, stream)
	at := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{redisstream.DefaultKeyField, "order-completed:77",
		adapter.EventTimeHeader, adapter.FormatEventTime(at), redisstream.PayloadField, "not json"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	c, err := redisstream.NewConsumer(l.mw, l.handler(), redisstream.WithBlock(20*time.Millisecond), redisstream.WithDeadLetter(ob, dead))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "the entry dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, rdb, stream); n != 0 {
		t.Fatalf("%d entries pending, want 0", n)
	}
	got := relayDeadLetters(t, ob, rdb, dead, 1)
	v := got[0].Values
	if v[redisstream.DefaultKeyField] != "order-completed:77" || v[redisstream.PayloadField] != "not json" ||
		v[adapter.EventTimeHeader] != adapter.FormatEventTime(at) || v[redisstream.DeadLetterSourceField] != stream+"/"+group+"/"+id ||
		v[redisstream.DeadLetterIDField] == "" || v[redisstream.DeadLetterErrorField] == "" {
		t.Fatalf("dead letter %v", v)
	}
	testenv.AuditOrders(t, l.db, l.schema, nil)
}

// TestDeadLetterReplayKeepsEventDay: on a claim table partitioned by event
// day, an entry dated 23:59:59.9999996Z whose first delivery is poison is
// dead-lettered through the outbox, and DeadLetterSender adds it to the
// dead-letter stream with its event time unchanged; that dead letter,
// replayed into the stream, and a re-send of the original are then one
// claim, on the entry's day, and one effect.
func TestDeadLetterReplayKeepsEventDay(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 4)
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	at := day.Add(24*time.Hour - 400*time.Nanosecond)
	clk := testenv.NewClock(day.Add(24*time.Hour + 30*time.Second))
	l := newLedger(t, db, "loyalty", idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(2), idempotent.WithClock(clk.Now))
	ctx := context.Background()
	ob := l.outbox(t)
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	dead := deadStream(t, rdb, stream)
	o := order{OrderID: 1, CustomerID: 1, Points: 5}
	publish(t, rdb, stream, o, at)
	var refused atomic.Bool
	credit := l.handler()
	c, err := redisstream.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, d *redisstream.Delivery) error {
		if !refused.Swap(true) {
			return adapter.Poison(errors.New("the ledger refused the order"))
		}
		return credit(ctx, tx, d)
	}, redisstream.WithBlock(20*time.Millisecond), redisstream.WithDeadLetter(ob, dead))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "the entry dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	got := relayDeadLetters(t, ob, rdb, dead, 1)
	if v := got[0].Values[adapter.EventTimeHeader]; v != adapter.FormatEventTime(at) {
		t.Errorf("the dead letter's event time is %v, want the entry's %s", v, adapter.FormatEventTime(at))
	}
	var replay []any
	for k, v := range got[0].Values {
		replay = append(replay, k, v)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: replay}).Err(); err != nil {
		t.Fatal(err)
	}
	publish(t, rdb, stream, o, at)
	waitFor(t, 10*time.Second, "the replay and the re-send settled", func() bool { s := c.Stats(); return s.Applied+s.Duplicates == 2 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if days := testenv.ClaimDays(t, db, l.schema, o.Key()); !slices.Equal(days, []string{"2026-11-30"}) {
		t.Errorf("claims of %s on days %v, want [2026-11-30]", o.Key(), days)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// TestTrimmedPendingEntry: an entry trimmed from the stream while it waits
// for its requeue delay can no longer be read again: it leaves the
// pending list and is never applied.
func TestTrimmedPendingEntry(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	publish(t, rdb, stream, testenv.MakeOrders(1)[0], time.Now().Add(-time.Minute))
	c, err := redisstream.NewConsumer(l.mw, func(context.Context, *sql.Tx, *redisstream.Delivery) error {
		return errors.New("the ledger service is down")
	}, redisstream.WithBlock(20*time.Millisecond), redisstream.WithRetryDelay(200*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "the entry requeued", func() bool { return c.Stats().Requeued == 1 })
	if err := rdb.XTrimMaxLen(context.Background(), stream, 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the trimmed entry gone from the pending list", func() bool { return pending(t, rdb, stream) == 0 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Requeued != 1 || s.Applied+s.Duplicates+s.DeadLettered != 0 {
		t.Fatalf("stats %+v, want the one requeue and nothing more", s)
	}
}

// TestLoadWithKills: 3,000 entries, 30% of them re-sends of others, read
// by consumers that are killed twice along the way (each leaving its
// in-flight and read entries pending): every order is applied exactly
// once, nothing is left pending.
func TestLoadWithKills(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "per-message", true: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			l := newLedger(t, testenv.OpenPostgres(t, 8), "loyalty")
			admin := newClient(t, redisAddr())
			stream := newStream(t, admin, group)
			const total = 3000
			orders := testenv.MakeOrders(total * 7 / 10)
			rng := rand.New(rand.NewPCG(1, 2))
			p := admin.Pipeline()
			at := time.Now().Add(-time.Minute)
			for i := range total {
				o := orders[i%len(orders)]
				if i >= len(orders) {
					o = orders[rng.IntN(len(orders))]
				}
				p.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{redisstream.DefaultKeyField, o.Key(),
					adapter.EventTimeHeader, adapter.FormatEventTime(at), redisstream.PayloadField, mustJSON(t, o)}})
			}
			cmds, err := p.Exec(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			lastID := cmds[len(cmds)-1].(*redis.StringCmd).Val()
			var settled atomic.Int64
			obs := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
				switch e.Type {
				case adapter.EventApplied, adapter.EventDuplicate, adapter.EventDeadLettered:
					settled.Add(1)
				}
			})
			newC := func(name string) *redisstream.Consumer {
				opts := []redisstream.Option{redisstream.WithWorkers(4), redisstream.WithObserver(obs), redisstream.WithBlock(20 * time.Millisecond),
					redisstream.WithClaimIdle(200 * time.Millisecond), redisstream.WithConsumerName(name),
					redisstream.WithRetryDelay(5*time.Millisecond, 20*time.Millisecond)}
				var c *redisstream.Consumer
				var err error
				if batch {
					c, err = redisstream.NewBatchConsumer(l.mw, l.batchHandler(), append(opts, redisstream.WithBatchSize(50))...)
				} else {
					c, err = redisstream.NewConsumer(l.mw, l.handler(), opts...)
				}
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			var stats []adapter.Stats
			for i, until := range []int64{total / 3, 2 * total / 3} {
				cl := newClient(t, redisAddr())
				c := newC(fmt.Sprintf("doomed-%d", i))
				r := start(c, cl, stream, group)
				waitFor(t, 30*time.Second, fmt.Sprintf("%d settled", until), func() bool { return settled.Load() >= until })
				_ = cl.Close() // the kill
				if err := r.wait(t); !errors.Is(err, redisstream.ErrClientClosed) {
					t.Fatalf("killed Run: %v, want ErrClientClosed", err)
				}
				stats = append(stats, c.Stats())
			}
			last := newC("survivor")
			r := start(last, newClient(t, redisAddr()), stream, group)
			waitFor(t, 30*time.Second, "every entry read and acknowledged", func() bool { return delivered(t, admin, stream) == lastID && pending(t, admin, stream) == 0 })
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			stats = append(stats, last.Stats())
			var applied, dups, dead int64
			for _, s := range stats {
				applied, dups, dead = applied+s.Applied, dups+s.Duplicates, dead+s.DeadLettered
			}
			t.Logf("stats per consumer %+v", stats)
			if applied != int64(len(orders)) || dead != 0 || applied+dups < total {
				t.Fatalf("applied %d, duplicates %d, dead-lettered %d: want %d applied, the rest of %d duplicates", applied, dups, dead, len(orders), total)
			}
			testenv.AuditOrders(t, l.db, l.schema, orders)
		})
	}
}

// TestLongHandlerKept: an entry whose handler runs for several claim idle
// bounds is touched by its consumer meanwhile, so another consumer of the
// group does not re-claim it; it is applied once, by the first.
func TestLongHandlerKept(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	o := testenv.MakeOrders(1)[0]
	id := publish(t, rdb, stream, o, time.Now().Add(-time.Minute))
	const idle = 100 * time.Millisecond
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // a failed test lets the handler end too
	slow := redisstream.Decode(redisstream.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *redisstream.Delivery) error {
		close(started)
		<-release
		return testenv.Credit(ctx, tx, l.schema, o)
	})
	a, err := redisstream.NewConsumer(l.mw, slow, redisstream.WithBlock(20*time.Millisecond), redisstream.WithClaimIdle(idle), redisstream.WithConsumerName("a"))
	if err != nil {
		t.Fatal(err)
	}
	ra := start(a, rdb, stream, group)
	<-started
	b, err := redisstream.NewConsumer(l.mw, l.handler(), redisstream.WithBlock(20*time.Millisecond), redisstream.WithClaimIdle(idle), redisstream.WithConsumerName("b"))
	if err != nil {
		t.Fatal(err)
	}
	rb := start(b, newClient(t, redisAddr()), stream, group)
	// Watch the entry for five idle bounds: it stays a's, never idle for
	// a whole bound.
	for end := time.Now().Add(5 * idle); time.Now().Before(end); time.Sleep(idle / 10) {
		pe, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: group, Start: id, End: id, Count: 1}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(pe) != 1 || pe[0].Consumer != "a" || pe[0].RetryCount != 1 || pe[0].Idle >= idle {
			t.Fatalf("the in-flight entry's pending state %+v, want a's, delivered once, idle under %v", pe, idle)
		}
	}
	unblock()
	waitFor(t, 10*time.Second, "the entry applied", func() bool { return a.Stats().Applied == 1 })
	if err := ra.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := rb.stop(t); err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.Applied+s.Duplicates+s.Requeued != 0 {
		t.Fatalf("the other consumer's stats %+v, want no delivery", s)
	}
	testenv.AuditOrders(t, l.db, l.schema, []order{o})
}

// TestBatchPoisonItem: an entry the batch handler names poison is
// dead-lettered alone; the rest of its batch runs again without it and is
// applied, each entry settled on its own.
func TestBatchPoisonItem(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	orders := testenv.MakeOrders(5)
	at := time.Now().Add(-time.Minute)
	for _, o := range orders[:2] {
		publish(t, rdb, stream, o, at)
	}
	bad, err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{redisstream.DefaultKeyField, "order-completed:bad",
		adapter.EventTimeHeader, adapter.FormatEventTime(at), redisstream.PayloadField, "not an order"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range orders[2:] {
		publish(t, rdb, stream, o, at)
	}
	var ev events
	c, err := redisstream.NewBatchConsumer(l.mw, l.batchHandler(), redisstream.WithObserver(&ev), redisstream.WithBatchSize(10),
		redisstream.WithBlock(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "every entry settled", func() bool { s := c.Stats(); return s.Applied+s.DeadLettered == 6 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Applied != 5 || s.DeadLettered != 1 || s.Requeued != 0 {
		t.Fatalf("stats %+v, want 5 applied and 1 dead-lettered", s)
	}
	dl := ev.of(adapter.EventDeadLettered)[0]
	if d := dl.Detail.(redisstream.Dropped).Delivery; d.ID != bad || !errors.Is(dl.Err, adapter.ErrUndecodable) || dl.Message.Key != "order-completed:bad" {
		t.Fatalf("dead letter %+v, want entry %s, undecodable", dl, bad)
	}
	if n := pending(t, rdb, stream); n != 0 {
		t.Fatalf("%d entries pending, want 0", n)
	}
	testenv.AuditOrders(t, l.db, l.schema, orders)
}

// TestStreamDeleted: Run ends with ErrNoGroup once its stream (and with it
// the group) is deleted.
func TestStreamDeleted(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 2), "loyalty")
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, group)
	publish(t, rdb, stream, testenv.MakeOrders(1)[0], time.Now().Add(-time.Minute))
	c, err := redisstream.NewConsumer(l.mw, l.handler(), redisstream.WithBlock(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, rdb, stream, group)
	waitFor(t, 10*time.Second, "the entry applied", func() bool { return c.Stats().Applied == 1 })
	if err := rdb.Del(context.Background(), stream).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.wait(t); !errors.Is(err, redisstream.ErrNoGroup) {
		t.Fatalf("Run after its stream was deleted: %v, want ErrNoGroup", err)
	}
}
