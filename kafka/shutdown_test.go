package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/kafka"
)

// TestGracefulShutdown: Run's context ends while a handler is in flight.
// The handler's transaction still commits (its context is not cancelled),
// no later record starts, Run returns nil, and the member has left the
// group.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4)
	s := schema(t, db)
	mw := newMiddleware(t, db, s, "shut")
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	const topic, blockAt = "shut", 3
	cluster := newCluster(t, 1, topic)
	prod := producer(t, cluster)
	for i := range 8 {
		v, _ := json.Marshal(payment{ID: fmt.Sprintf("s-%d", i), Account: "acct", Amount: 1})
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: v,
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: fmt.Appendf(nil, "s-%d", i)}}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	inFlight, finish := make(chan struct{}), make(chan struct{})
	c, err := kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
		if p.ID == fmt.Sprintf("s-%d", blockAt) {
			close(inFlight)
			<-finish
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("the handler's context ended at shutdown: %w", err)
			}
		}
		return applyPayment(ctx, tx, s, "m", p)
	}), kafka.WithOffsetsTable(s+".kafka_offsets"))
	if err != nil {
		t.Fatal(err)
	}
	m := startMember(c, "m", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("shut-group"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	<-inFlight
	m.cancel()
	close(finish)
	select {
	case err := <-m.done:
		if err != nil {
			t.Fatalf("Run after its context ended: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
	}
	if got := storedOffsets(t, db, s, "shut", topic)[0]; got != blockAt+1 {
		t.Errorf("stored offset %d after the shutdown, want %d: the in-flight record committed, no later one started", got, blockAt+1)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ` + s + `.ledger`).Scan(&n); err != nil || n != blockAt+1 {
		t.Errorf("%d payments applied (%v), want %d", n, err, blockAt+1)
	}
	if g := cluster.GroupInfo("shut-group"); g != nil && len(g.Members) != 0 {
		t.Errorf("the group still has %d members after Run returned", len(g.Members))
	}
}
