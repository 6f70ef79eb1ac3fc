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

// TestZombie: member A stalls on a record (its key function blocks, before
// its transaction begins) while holding partition 0; member B joins, the
// group fences A out at the rebalance timeout and gives B the partition,
// and B applies the rest, dead letter included. When A wakes it goes on
// with the record it had: its offset advance finds the stored offset
// already past it, so its transaction rolls back — it applies nothing,
// dead-letters nothing, and the stored offset never moves backwards.
func TestZombie(t *testing.T) {
	t.Parallel()
	db := openDB(t, 8)
	s := schema(t, db)
	mw := newMiddleware(t, db, s, "zombie")
	ob := newOutbox(t, db, s, "zombie")
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	const topic, records, stallAt, poisonAt = "zombie", 10, 2, 5
	cluster := newCluster(t, 1, topic)
	prod := producer(t, cluster)
	for i := range records {
		v, _ := json.Marshal(payment{ID: fmt.Sprintf("z-%d", i), Account: "acct", Amount: 1})
		rec := &kgo.Record{Topic: topic, Value: v, Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: fmt.Appendf(nil, "z-%d", i)}}}
		if i == poisonAt {
			rec.Headers = nil
		}
		if err := prod.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	clientOpts := func(instance string) []kgo.Opt {
		return []kgo.Opt{
			kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("zombie-group"), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
			// An eager balancer: a member must give its partitions up
			// before it rejoins, so a stalled member is left out of the
			// next generation at the rebalance timeout.
			kgo.Balancers(kgo.RangeBalancer()),
			kgo.SessionTimeout(2 * time.Second), kgo.RebalanceTimeout(500 * time.Millisecond), kgo.HeartbeatInterval(100 * time.Millisecond),
			kgo.ClientID(instance),
		}
	}
	handler := func(member string) kafka.Handler {
		return kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
			return applyPayment(ctx, tx, s, member, p)
		})
	}

	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stallKey := func(r *kgo.Record) (string, error) {
		if r.Offset == stallAt {
			once.Do(func() {
				close(stalled)
				<-release
			})
		}
		return kafka.Header(kafka.DefaultKeyHeader)(r)
	}
	// What A did with the record it stalled on.
	woke := make(chan adapter.Event, 4)
	obsA := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
		switch e.Type {
		case adapter.EventFenced, adapter.EventApplied, adapter.EventDuplicate, adapter.EventDeadLettered:
			if r := recordOf(e); r != nil && r.Offset == stallAt {
				woke <- e
			}
		}
	})
	common := []kafka.Option{kafka.WithOffsetsTable(s + ".kafka_offsets"), kafka.WithDeadLetter(ob, "zombie-dlq"),
		kafka.WithRetryDelay(10*time.Millisecond, 100*time.Millisecond), kafka.WithShutdownTimeout(5 * time.Second)}
	a, err := kafka.NewConsumer(mw, handler("A"), append(common, kafka.WithKey(stallKey), kafka.WithObserver(obsA))...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kafka.NewConsumer(mw, handler("B"), common...)
	if err != nil {
		t.Fatal(err)
	}

	ma := startMember(a, "A", clientOpts("A")...)
	select {
	case <-stalled:
	case err := <-ma.done:
		t.Fatalf("member A: Run returned before reaching offset %d: %v", stallAt, err)
	case <-time.After(time.Minute):
		t.Fatalf("member A never reached offset %d", stallAt)
	}
	if got := storedOffsets(t, db, s, "zombie", topic)[0]; got != stallAt {
		t.Fatalf("stored offset %d while A is stalled, want %d", got, stallAt)
	}

	mb := startMember(b, "B", clientOpts("B")...)
	waitFor(t, "B to apply the partition to its end", func() (bool, error) {
		return storedOffsets(t, db, s, "zombie", topic)[0] == records, nil
	})
	close(release)
	select {
	case e := <-woke:
		if e.Type != adapter.EventFenced {
			t.Errorf("A's record at offset %d ended %v after A woke, want fenced", stallAt, e.Type)
		}
	case <-time.After(time.Minute):
		t.Fatal("A did nothing with its record after it woke")
	}
	mb.stop(t)
	ma.stop(t)

	if got := storedOffsets(t, db, s, "zombie", topic)[0]; got != records {
		t.Errorf("stored offset %d after A woke, want %d: the zombie moved it backwards", got, records)
	}
	rows, err := db.Query(`SELECT id, member FROM ` + s + `.ledger ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string][]string{}
	for rows.Next() {
		var id, m string
		if err := rows.Scan(&id, &m); err != nil {
			t.Fatal(err)
		}
		applied[id] = append(applied[id], m)
	}
	rows.Close()
	for i := range records {
		id := fmt.Sprintf("z-%d", i)
		want := "A"
		switch {
		case i == poisonAt:
			if len(applied[id]) != 0 {
				t.Errorf("poison record %s applied by %v", id, applied[id])
			}
			continue
		case i >= stallAt:
			want = "B"
		}
		if len(applied[id]) != 1 || applied[id][0] != want {
			t.Errorf("%s applied by %v, want once by %s", id, applied[id], want)
		}
	}
	var dead int
	if err := db.QueryRow(`SELECT count(*) FROM `+s+`.outbox WHERE kind = $1 AND message_key = $2`, kafka.DeadLetterKind, fmt.Sprintf("%s/0/%d", topic, poisonAt)).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 1 {
		t.Errorf("%d dead letters for the poison record, want 1", dead)
	}
	if st := a.Stats(); st.Fenced != 1 || st.Applied != stallAt {
		t.Errorf("A's stats %+v, want 1 fenced and %d applied", st, stallAt)
	}
}
