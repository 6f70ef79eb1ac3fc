package redisstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/redisstream"
)

// BenchmarkPerMessageVsBatch measures, side by side in one run, how many
// entries per second a per-message Consumer (one transaction and one XACK
// per entry) and a batch Consumer (one transaction and one XACK pipeline
// per read of up to 100) apply from the local Redis into Postgres, each
// with 4 workers. Both read the same stream in groups of their own, into
// ledgers of their own.
func BenchmarkPerMessageVsBatch(b *testing.B) {
	const n = 2000
	rdb := newClient(b, redisAddr())
	db := testenv.OpenPostgres(b, 10)
	var perMsg, batched time.Duration
	total := 0
	for b.Loop() {
		stream := newStream(b, rdb, "per-message")
		if err := rdb.XGroupCreate(context.Background(), stream, "batch", "0").Err(); err != nil {
			b.Fatal(err)
		}
		orders := testenv.MakeOrders(n)
		p := rdb.Pipeline()
		at := adapter.FormatEventTime(time.Now().Add(-time.Minute))
		for _, o := range orders {
			p.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{redisstream.DefaultKeyField, o.Key(),
				adapter.EventTimeHeader, at, redisstream.PayloadField, mustJSON(b, o)}})
		}
		if _, err := p.Exec(context.Background()); err != nil {
			b.Fatal(err)
		}
		one := newLedger(b, db, "per-message")
		many := newLedger(b, db, "batch")
		c1, err := redisstream.NewConsumer(one.mw, one.handler(), redisstream.WithWorkers(4), redisstream.WithBlock(20*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		c2, err := redisstream.NewBatchConsumer(many.mw, many.batchHandler(), redisstream.WithWorkers(4), redisstream.WithBatchSize(100),
			redisstream.WithBlock(20*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		perMsg += consumeAll(b, c1, rdb, stream, "per-message", n)
		batched += consumeAll(b, c2, rdb, stream, "batch", n)
		testenv.AuditOrders(b, db, one.schema, orders)
		testenv.AuditOrders(b, db, many.schema, orders)
		total += n
	}
	pm := float64(total) / perMsg.Seconds()
	bm := float64(total) / batched.Seconds()
	b.ReportMetric(pm, "per-message-msgs/s")
	b.ReportMetric(bm, "batch-msgs/s")
	b.ReportMetric(bm/pm, "batch/per-message")
	b.Logf("%d entries each: per-message %.0f msgs/s, batch of 100 %.0f msgs/s, ratio %.2f", total, pm, bm, bm/pm)
}

// consumeAll runs c on stream in group until it has acknowledged n entries
// and returns how long that took.
func consumeAll(b *testing.B, c *redisstream.Consumer, rdb *redis.Client, stream, group string, n int) time.Duration {
	b.Helper()
	acked := func() int64 { s := c.Stats(); return s.Applied + s.Duplicates }
	before := acked()
	begin := time.Now()
	r := start(c, rdb, stream, group)
	waitFor(b, 5*time.Minute, "every XACK", func() bool { return acked()-before >= int64(n) })
	d := time.Since(begin)
	if err := r.stop(b); err != nil {
		b.Fatal(err)
	}
	return d
}
