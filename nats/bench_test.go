package nats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	idnats "github.com/txclaim/idempotent/nats"

	"github.com/txclaim/idempotent/internal/testenv"
)

// BenchmarkPerMessageVsBatch measures, side by side in one run, how many
// messages per second a per-message Consumer (one transaction per message)
// and a batch Consumer (one per fetch of up to 100) apply from the local
// JetStream server into Postgres, each with 4 workers. Both read the same
// stream through durables of their own, into ledgers of their own.
func BenchmarkPerMessageVsBatch(b *testing.B) {
	const n = 2000
	nc := localNATS(b)
	js := newJS(b, nc)
	db := testenv.OpenPostgres(b, 10)
	var perMsg, batched time.Duration
	total := 0
	for b.Loop() {
		s, stream := newStream(b, js, 1)
		orders := testenv.MakeOrders(n)
		var msgs []outMsg
		for _, o := range orders {
			msgs = append(msgs, outMsg{msgID: o.Key(), data: mustJSON(b, o)})
		}
		if _, err := publishAll(context.Background(), js, stream+".orders", msgs, nil); err != nil {
			b.Fatal(err)
		}
		one := newLedger(b, db, "per-message")
		many := newLedger(b, db, "batch")
		c1 := must(b)(idnats.NewConsumer(one.mw, one.handler(), idnats.WithWorkers(4), idnats.WithFetchSize(32), idnats.WithFetchWait(50*time.Millisecond)))
		c2 := must(b)(idnats.NewBatchConsumer(many.mw, many.batchHandler(), idnats.WithBatchSize(100), idnats.WithWorkers(4), idnats.WithFetchWait(50*time.Millisecond)))
		perMsg += consumeAll(b, c1, newConsumer(b, s, "per-message", 30*time.Second), n)
		batched += consumeAll(b, c2, newConsumer(b, s, "batch", 30*time.Second), n)
		one.audit(b, orders)
		many.audit(b, orders)
		total += n
	}
	pm := float64(total) / perMsg.Seconds()
	bm := float64(total) / batched.Seconds()
	b.ReportMetric(pm, "per-message-msgs/s")
	b.ReportMetric(bm, "batch-msgs/s")
	b.ReportMetric(bm/pm, "batch/per-message")
	b.Log(fmt.Sprintf("%d messages each: per-message %.0f msgs/s, batch of 100 %.0f msgs/s, ratio %.2f", total, pm, bm, bm/pm))
}

// consumeAll runs c until it has acked n messages and returns how long that
// took.
func consumeAll(b *testing.B, c *idnats.Consumer, cons jetstream.Consumer, n int) time.Duration {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(ctx, cons) }()
	acked := func() int64 { s := c.Stats(); return s.Applied + s.Duplicates }
	before := acked()
	waitFor(b, 5*time.Minute, "every ack", func() (bool, error) { return acked()-before >= int64(n), nil })
	d := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return d
}
