package cdkpubsub_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/mempubsub"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
)

// BenchmarkPerMessageVsBatch measures, side by side in one run, how many
// messages per second a per-message Consumer (one transaction per message)
// and a batch Consumer (one per batch of up to 100) apply from mempubsub
// into Postgres, each with 4 workers, each on a topic, subscription and
// ledger of its own.
func BenchmarkPerMessageVsBatch(b *testing.B) {
	perMessageVsBatch(b, 2000, consumeAll)
}

// perMessageVsBatch runs, per benchmark iteration, n orders through a
// per-message Consumer and then a batch Consumer (batches of up to 100),
// each with 4 workers and a ledger of its own, by consume, audits both, and
// reports both rates and their ratio.
func perMessageVsBatch(b *testing.B, n int, consume func(*testing.B, *cdkpubsub.Consumer, []order) time.Duration) {
	var perMsg, batched time.Duration
	total := 0
	for b.Loop() {
		orders := testenv.MakeOrders(n)
		one, many := newLedger(b), newLedger(b)
		c1, err := cdkpubsub.NewConsumer(one.mw, one.handler(), cdkpubsub.WithWorkers(4))
		if err != nil {
			b.Fatal(err)
		}
		c2, err := cdkpubsub.NewBatchConsumer(many.mw, many.batchHandler(), cdkpubsub.WithWorkers(4), cdkpubsub.WithBatchSize(100))
		if err != nil {
			b.Fatal(err)
		}
		perMsg += consume(b, c1, orders)
		batched += consume(b, c2, orders)
		testenv.AuditOrders(b, one.db, one.schema, orders)
		testenv.AuditOrders(b, many.db, many.schema, orders)
		total += n
	}
	pm := float64(total) / perMsg.Seconds()
	bm := float64(total) / batched.Seconds()
	b.ReportMetric(pm, "per-message-msgs/s")
	b.ReportMetric(bm, "batch-msgs/s")
	b.ReportMetric(bm/pm, "batch/per-message")
	b.Logf("%d messages each: per-message %.0f msgs/s, batch of 100 %.0f msgs/s, ratio %.2f", total, pm, bm, bm/pm)
}

// consumeAll publishes orders to a new mempubsub topic and runs c on a
// subscription of it until every order is acked, and returns how long the
// run took.
func consumeAll(b *testing.B, c *cdkpubsub.Consumer, orders []order) time.Duration {
	b.Helper()
	ctx := context.Background()
	topic := mempubsub.NewTopic()
	sub := mempubsub.NewSubscription(topic, time.Minute)
	defer topic.Shutdown(ctx)
	at := adapter.FormatEventTime(time.Now())
	for _, o := range orders {
		body, _ := json.Marshal(o)
		if err := topic.Send(ctx, &pubsub.Message{Body: body, Metadata: map[string]string{cdkpubsub.DefaultKeyMetadata: o.Key(), adapter.EventTimeHeader: at}}); err != nil {
			b.Fatal(err)
		}
	}
	return drain(ctx, b, c, len(orders), 2*time.Minute, sub)
}

// drain runs c on each of subs until n more deliveries have been acked
// (applied or duplicate), failing b after bound, and returns how long that
// took; then it stops c and shuts subs down.
func drain(ctx context.Context, b *testing.B, c *cdkpubsub.Consumer, n int, bound time.Duration, subs ...*pubsub.Subscription) time.Duration {
	b.Helper()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, len(subs))
	acked := func() int64 { s := c.Stats(); return s.Applied + s.Duplicates }
	before := acked()
	start := time.Now()
	for _, sub := range subs {
		go func() { done <- c.Run(rctx, sub) }()
	}
	deadline := time.Now().Add(bound)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for acked()-before < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("after %v: %d of %d acked", bound, acked()-before, n)
		}
		<-tick.C
	}
	d := time.Since(start)
	cancel()
	for range subs {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	for _, sub := range subs {
		if err := sub.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return d
}
