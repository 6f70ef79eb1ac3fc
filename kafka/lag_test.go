package kafka_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/kafka"
)

// TestLagCountsFromTheStoredOffsets: partition 0 holds five records and
// its stored offset is 2, so it lags three; partition 1 holds three and
// has no stored offset, so it lags all three.
func TestLagCountsFromTheStoredOffsets(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, 4)
	s := schema(t, db)
	mw := newMiddleware(t, db, s, "shipping")
	c, err := kafka.NewConsumer(mw, func(context.Context, *sql.Tx, *kgo.Record) error { return nil }, kafka.WithOffsetsTable(s+".kafka_offsets"))
	if err != nil {
		t.Fatal(err)
	}
	cluster := newCluster(t, 2, "orders")
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for p, n := range map[int32]int{0: 5, 1: 3} {
		for range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "orders", Partition: p, Value: []byte("{}")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO `+s+`.kafka_offsets (consumer, topic, partition, next_offset) VALUES ('shipping', 'orders', 0, 2)`); err != nil {
		t.Fatal(err)
	}
	r, err := c.Lag(cl, "orders")
	if err != nil {
		t.Fatal(err)
	}
	lags, err := r.Lag(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, l := range lags {
		if l.System != "kafka" || l.Group != "shipping" || l.Destination != "orders" {
			t.Errorf("lag %+v, want kafka, group shipping, topic orders", l)
		}
		got[l.Partition] = l.Messages
	}
	if len(got) != 2 || got["0"] != 3 || got["1"] != 3 {
		t.Errorf("lag by partition %v, want 0: 3, 1: 3", got)
	}
	if _, err := c.Lag(nil, "orders"); err == nil {
		t.Error("nil client: no error")
	}
	if _, err := c.Lag(cl); err == nil {
		t.Error("no topic: no error")
	}
	r, err = c.Lag(cl, "missing")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Lag(ctx); err == nil {
		t.Error("lag of a topic the cluster does not know: no error")
	}
}
