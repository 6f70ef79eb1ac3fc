package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
)

// TestZombieMidTransaction: member A stalls inside its handler, its
// transaction open (offset advance and claim done, not committed), and is
// fenced out of the group; member B, given the partition, reads the stored
// offset A has not committed yet and reaches the same record: its offset
// advance waits for A's transaction. A then commits. B's advance finds the
// offset past the record, rolls back — it does not apply the record a
// second time — and B goes on from the stored offset. Every record is
// applied once and the stored offset ends at the partition's end.
func TestZombieMidTransaction(t *testing.T) {
	t.Parallel()
	db := openDB(t, 8)
	s := schema(t, db)
	mw := newMiddleware(t, db, s, "handoff")
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	const topic, records, stallAt = "handoff", 8, 2
	cluster := newCluster(t, 1, topic)
	prod := producer(t, cluster)
	for i := range records {
		v, _ := json.Marshal(payment{ID: fmt.Sprintf("h-%d", i), Account: "acct", Amount: 1})
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: v,
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: fmt.Appendf(nil, "h-%d", i)}}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	clientOpts := []kgo.Opt{
		kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("handoff-group"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.SessionTimeout(2 * time.Second), kgo.RebalanceTimeout(500 * time.Millisecond), kgo.HeartbeatInterval(100 * time.Millisecond),
	}
	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	handler := func(member string) kafka.Handler {
		return kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
			if member == "A" && p.ID == fmt.Sprintf("h-%d", stallAt) {
				once.Do(func() {
					close(stalled)
					<-release
				})
			}
			return applyPayment(ctx, tx, s, member, p)
		})
	}
	obsB := &counter{}
	opts := []kafka.Option{kafka.WithOffsetsTable(s + ".kafka_offsets"), kafka.WithRetryDelay(10*time.Millisecond, 100*time.Millisecond)}
	a, err := kafka.NewConsumer(mw, handler("A"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kafka.NewConsumer(mw, handler("B"), append(opts, kafka.WithObserver(obsB))...)
	if err != nil {
		t.Fatal(err)
	}
	ma := startMember(a, "A", clientOpts...)
	select {
	case <-stalled:
	case <-time.After(time.Minute):
		t.Fatal("A never reached the record it stalls on")
	}
	mb := startMember(b, "B", clientOpts...)
	// B's offset advance waits for A's transaction, which holds the row.
	waitFor(t, "B's offset advance to wait for A's transaction", func() (bool, error) {
		var n int
		err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%kafka_offsets%'`, s).Scan(&n)
		return n > 0, err
	})
	close(release)
	waitFor(t, "the partition applied to its end", func() (bool, error) {
		return storedOffsets(t, db, s, "handoff", topic)[0] == records, nil
	})
	mb.stop(t)
	ma.stop(t)

	rows, err := db.Query(`SELECT id, count(*), min(member) FROM ` + s + `.ledger GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	by := map[string]string{}
	for rows.Next() {
		var id, m string
		var n int
		if err := rows.Scan(&id, &n, &m); err != nil {
			t.Fatal(err)
		}
		applied[id], by[id] = n, m
	}
	rows.Close()
	for i := range records {
		if id := fmt.Sprintf("h-%d", i); applied[id] != 1 {
			t.Errorf("%s applied %d times", id, applied[id])
		}
	}
	if by[fmt.Sprintf("h-%d", stallAt)] != "A" {
		t.Errorf("h-%d applied by %s, want A, whose transaction B waited for", stallAt, by[fmt.Sprintf("h-%d", stallAt)])
	}
	if obsB.get(adapter.EventFenced) != 1 {
		t.Errorf("B was fenced %d times, want once: its advance of h-%d found A's", obsB.get(adapter.EventFenced), stallAt)
	}
}
