package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
)

// TestBatchConsumerPartitioned runs the batch consumer on a claim table
// partitioned by event day: each record's producer event time (its
// Idempotent-Event-Time header) is its event time, so its claim goes to its
// day's partition; producer duplicates apply once; a
// record older than the retention window and one dated in the future are
// dropped alone while the rest of their batches applies; and WithoutEventTime
// is refused with such a table.
func TestBatchConsumerPartitioned(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4)
	s := schema(t, db)
	ctx := context.Background()
	mw, err := idempotent.New(db, postgres.New(), "parted", idempotent.WithTable(s+".claims"),
		idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
		return applyPayments(ctx, tx, s, "m", rs)
	}
	if _, err := kafka.NewBatchConsumer(mw, handler, kafka.WithoutEventTime()); err == nil {
		t.Fatal("WithoutEventTime accepted with a partitioned claim table")
	}

	const topic = "parted"
	cluster := newCluster(t, 1, topic)
	prod := producer(t, cluster)
	now := time.Now()
	yesterday := now.Add(-24 * time.Hour)
	send := func(id string, at time.Time) {
		v, _ := json.Marshal(payment{ID: id, Account: "acct", Amount: 1})
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: v,
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}, eventTimeHeader(at)}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		at := now.Add(-time.Minute)
		if i%2 == 0 {
			at = yesterday
		}
		send(fmt.Sprintf("p-%d", i), at)
	}
	send("p-1", now.Add(-time.Minute))        // a producer duplicate
	send("too-old", now.Add(-5*24*time.Hour)) // beyond the retention window
	send("future", now.Add(48*time.Hour))     // beyond the clock-skew margin
	send("p-2", yesterday)                    // another duplicate
	const records = 10

	events := &dropped{}
	c, err := kafka.NewBatchConsumer(mw, handler, kafka.WithOffsetsTable(s+".kafka_offsets"), kafka.WithObserver(events))
	if err != nil {
		t.Fatal(err)
	}
	if err := kafka.EnsureSchema(ctx, db, s+".kafka_offsets"); err != nil {
		t.Fatal(err)
	}
	m := startMember(c, "m", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("parted-group"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	waitFor(t, "every record consumed", func() (bool, error) { return storedOffsets(t, db, s, "parted", topic)[0] == records, nil })
	m.stop(t)

	var ledger, balance int
	if err := db.QueryRow(`SELECT (SELECT count(DISTINCT id) FROM `+s+`.ledger), (SELECT balance FROM `+s+`.accounts WHERE id = 'acct')`).Scan(&ledger, &balance); err != nil {
		t.Fatal(err)
	}
	if ledger != 6 || balance != 6 {
		t.Fatalf("%d payments in the ledger, balance %d; want 6 and 6", ledger, balance)
	}
	want := map[string]int{} // claims per day partition
	want[yesterday.UTC().Format("20060102")] += 3
	want[now.Add(-time.Minute).UTC().Format("20060102")] += 3
	for day, want := range want {
		part := s + ".claims_p" + day
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM ` + part).Scan(&n); err != nil || n != want {
			t.Errorf("%s holds %d claims (%v), want %d", part, n, err, want)
		}
	}
	events.mu.Lock()
	defer events.mu.Unlock()
	if len(events.errs) != 2 || !errors.Is(events.errs[0], idempotent.ErrBeyondRetention) || !errors.Is(events.errs[1], idempotent.ErrInvalidEventTime) {
		t.Errorf("dropped: %v; want the record beyond retention, then the one dated in the future", errors.Join(events.errs...))
	}
	if !slices.Equal(events.keys, []string{"too-old", "future"}) {
		t.Errorf("dropped keys %q, want too-old and future: every event carries the record's key", events.keys)
	}
}

// dropped is an adapter.Observer that keeps the errors and keys of dropped
// records (dead-lettered with a kafka.Dropped Detail), in the order of
// their events.
type dropped struct {
	mu   sync.Mutex
	errs []error
	keys []string
}

func (d *dropped) Observe(_ context.Context, e adapter.Event) {
	if _, ok := e.Detail.(kafka.Dropped); !ok || e.Type != adapter.EventDeadLettered {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errs = append(d.errs, e.Err)
	d.keys = append(d.keys, e.Message.Key)
}
