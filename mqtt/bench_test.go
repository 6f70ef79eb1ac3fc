package mqtt_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
)

// BenchmarkPerMessageVsBatch measures, side by side in one run, how many
// messages per second a per-message Consumer (one transaction per message)
// and a batch Consumer (one per batch of up to 100) apply from Mosquitto
// (QoS 1, 1,000 queued in the session before the consumer starts) into Postgres,
// each with 4 workers, on a topic, session and ledger of its own.
func BenchmarkPerMessageVsBatch(b *testing.B) {
	const n = 1000 // Mosquitto keeps at most 1000 messages for a session offline by default (max_queued_messages)
	addr := brokerAddr(b)
	var perMsg, batched time.Duration
	total := 0
	for b.Loop() {
		orders := testenv.MakeOrders(n)
		one, many := newLedger(b), newLedger(b)
		c1, err := mqtt.NewConsumer(one.mw, one.handler(), mqtt.WithWorkers(4))
		if err != nil {
			b.Fatal(err)
		}
		c2, err := mqtt.NewBatchConsumer(many.mw, many.batchHandler(), mqtt.WithWorkers(4), mqtt.WithBatchSize(100))
		if err != nil {
			b.Fatal(err)
		}
		perMsg += consumeAll(b, addr, c1, orders)
		batched += consumeAll(b, addr, c2, orders)
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

// batchHandler credits a batch's fresh orders with testenv.CreditBatch.
func (l *ledger) batchHandler() mqtt.BatchHandler {
	return func(ctx context.Context, tx *sql.Tx, msgs []*paho.Publish) error {
		orders := make([]order, len(msgs))
		for i, m := range msgs {
			o, err := mqtt.JSON[order](m.Payload)
			if err != nil {
				return adapter.PoisonItem(i, err)
			}
			orders[i] = o
		}
		return testenv.CreditBatch(ctx, tx, l.schema, orders)
	}
}

// consumeAll publishes orders into a new session and runs c on it until
// every order is acknowledged, and returns how long the run took.
func consumeAll(b *testing.B, addr string, c *mqtt.Consumer, orders []order) time.Duration {
	b.Helper()
	topic := "idempotent/" + testenv.UniqueName("bench")
	clientID := testenv.UniqueName("bench")
	openSession(b, addr, clientID, topic, 1)
	pub := connect(b, addr, testenv.UniqueName("pub"), 0)
	for _, o := range orders {
		sendOrder(b, pub, topic, 1, o)
	}
	acked := func() int64 { s := c.Stats(); return s.Applied + s.Duplicates }
	before := acked()
	start := time.Now()
	p := startProc(c, addr, clientID, topic, 1)
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for acked()-before < int64(len(orders)) {
		if time.Now().After(deadline) {
			b.Fatalf("after 2m: %d of %d acknowledged", acked()-before, len(orders))
		}
		<-tick.C
	}
	d := time.Since(start)
	p.stop(b)
	return d
}
