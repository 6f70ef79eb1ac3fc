package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/outbox"
)

// TestDeadLetterRelay: a consumer dead-letters the poison records of a
// topic into the outbox, and an outbox Relay with DeadLetterSender produces
// each to the dead-letter topic — byte for byte, with the headers that say
// where it came from, why, and the id its readers drop repeats by, and
// with the event time the consumer read (here from a header of the
// producer's own) in the adapter.EventTimeHeader header.
func TestDeadLetterRelay(t *testing.T) {
	t.Parallel()
	db := openDB(t, 8)
	s := schema(t, db)
	mw := newMiddleware(t, db, s, "dl")
	ob := newOutbox(t, db, s, "dl")
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	cluster := newCluster(t, 1, "in", "in-dlq")
	prod := producer(t, cluster)
	good, _ := json.Marshal(payment{ID: "p-1", Account: "acct", Amount: 5})
	at := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	occurred := kgo.RecordHeader{Key: "occurred-at", Value: []byte(at.Format(time.RFC3339))}
	recs := []*kgo.Record{
		{Topic: "in", Value: good, Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte("p-1")}, occurred}},
		{Topic: "in", Key: []byte("k"), Value: []byte("no key header"), Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t-1")}, occurred}},
		{Topic: "in", Value: []byte("{not json"), Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte("p-2")}, occurred}},
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	c, err := kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
		return applyPayment(ctx, tx, s, "m", p)
	}), kafka.WithOffsetsTable(s+".kafka_offsets"), kafka.WithDeadLetter(ob, "in-dlq"), kafka.WithEventTime(kafka.TimeHeader("occurred-at")))
	if err != nil {
		t.Fatal(err)
	}
	m := startMember(c, "m", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("dl"), kgo.ConsumeTopics("in"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	waitFor(t, "the topic consumed", func() (bool, error) { return storedOffsets(t, db, s, "dl", "in")[0] == 3, nil })
	m.stop(t)
	if st := c.Stats(); st.Applied != 1 || st.DeadLettered != 2 {
		t.Fatalf("stats %+v, want 1 applied and 2 dead-lettered", st)
	}

	relay, err := outbox.NewRelay(ob, outbox.WithSender(kafka.DeadLetterKind, kafka.DeadLetterSender(prod)), outbox.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- relay.Run(rctx) }()
	reader, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("in-dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var got []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(got) < 2 {
		f := reader.PollFetches(ctx)
		if err := f.Err0(); err != nil {
			t.Fatalf("reading the dead-letter topic: %v", err)
		}
		got = append(got, f.Records()...)
	}
	rcancel()
	if err := <-rdone; err != nil {
		t.Errorf("relay: %v", err)
	}
	headers := func(r *kgo.Record) map[string]string {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		return h
	}
	// A relay sends concurrently: the dead letters come in any order.
	bySource := map[string]*kgo.Record{}
	for _, r := range got {
		bySource[headers(r)[kafka.DeadLetterSourceHeader]] = r
	}
	for i, want := range []struct {
		src   *kgo.Record
		where string
		at    string // the event-time header: none for a record whose key could not be read
	}{{recs[1], "in/0/1", ""}, {recs[2], "in/0/2", adapter.FormatEventTime(at)}} {
		r := bySource[want.where]
		if r == nil {
			t.Errorf("no dead letter from %s among %d", want.where, len(got))
			continue
		}
		h := headers(r)
		if string(r.Value) != string(want.src.Value) || string(r.Key) != string(want.src.Key) {
			t.Errorf("dead letter %d: key %q value %q, want %q %q", i, r.Key, r.Value, want.src.Key, want.src.Value)
		}
		if h[kafka.DeadLetterSourceHeader] != want.where || h[kafka.DeadLetterIDHeader] != outbox.Key("dl", want.where, kafka.DeadLetterKind) || h[kafka.DeadLetterErrorHeader] == "" {
			t.Errorf("dead letter %d headers %v, want source %s, its outbox key as id, and an error", i, h, want.where)
		}
		for _, x := range want.src.Headers {
			if h[x.Key] != string(x.Value) {
				t.Errorf("dead letter %d lost header %s=%s: %v", i, x.Key, x.Value, h)
			}
		}
		if h[adapter.EventTimeHeader] != want.at {
			t.Errorf("dead letter %d: event-time header %q, want %q", i, h[adapter.EventTimeHeader], want.at)
		}
	}
}
