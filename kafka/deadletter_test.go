package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
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

	got := relayDeadLetters(t, ob, prod, cluster, "in-dlq", 2)
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

// TestDeadLetterReplayKeepsEventDay: on a claim table partitioned by event
// day, a record dated 23:59:59.9999996Z whose first delivery is poison is
// dead-lettered through the outbox, and an outbox Relay with
// DeadLetterSender produces it to the dead-letter topic with its event time
// unchanged; that dead letter, replayed into the topic, and a re-send of
// the original are then one claim, on the record's day, and one effect.
// It runs before the parallel tests, as
// TestFutureDatedRecordDoesNotHoldItsPartition does.
func TestDeadLetterReplayKeepsEventDay(t *testing.T) {
	db := openDB(t, 8)
	s := schema(t, db)
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	at := day.Add(24*time.Hour - 400*time.Nanosecond)
	clk := testenv.NewClock(day.Add(24*time.Hour + 30*time.Second))
	mw := newMiddleware(t, db, s, "dlday", idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(2), idempotent.WithClock(clk.Now))
	ob := newOutbox(t, db, s, "dlday")
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	cluster := newCluster(t, 1, "in", "in-dlq")
	prod := producer(t, cluster)
	var refused atomic.Bool
	c, err := kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
		if !refused.Swap(true) {
			return adapter.Poison(errors.New("the ledger refused the payment"))
		}
		return applyPayment(ctx, tx, s, "m", p)
	}), kafka.WithOffsetsTable(s+".kafka_offsets"), kafka.WithDeadLetter(ob, "in-dlq"))
	if err != nil {
		t.Fatal(err)
	}
	const key = "ord-midnight"
	if err := prod.ProduceSync(context.Background(), paymentRecord("in", key, eventTimeHeader(at))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	m := startMember(c, "m", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("dlday"), kgo.ConsumeTopics("in"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	defer m.stop(t)
	waitFor(t, "the record dead-lettered", func() (bool, error) { return storedOffsets(t, db, s, "dlday", "in")[0] == 1, nil })

	dl := relayDeadLetters(t, ob, prod, cluster, "in-dlq", 1)
	for _, h := range dl[0].Headers {
		if h.Key == adapter.EventTimeHeader && string(h.Value) != adapter.FormatEventTime(at) {
			t.Errorf("the dead letter's event time is %s, want the record's %s", h.Value, adapter.FormatEventTime(at))
		}
	}
	replay := &kgo.Record{Topic: "in", Key: dl[0].Key, Value: dl[0].Value, Headers: dl[0].Headers}
	if err := prod.ProduceSync(context.Background(), replay, paymentRecord("in", key, eventTimeHeader(at))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replay and the re-send consumed", func() (bool, error) { return storedOffsets(t, db, s, "dlday", "in")[0] == 3, nil })
	if days := testenv.ClaimDays(t, db, s, key); !slices.Equal(days, []string{"2026-11-30"}) {
		t.Errorf("claims of %s on days %v, want [2026-11-30]", key, days)
	}
	if st, n := c.Stats(), ledgerRows(t, db, s); st.DeadLettered != 1 || st.Applied != 1 || st.Duplicates != 1 || n != 1 {
		t.Errorf("stats %+v, %d ledger rows: want 1 dead-lettered, 1 applied, 1 duplicate and 1 row", st, n)
	}
}

// relayDeadLetters runs an outbox Relay with DeadLetterSender on ob,
// producing with prod, until n records have been read from the
// dead-letter topic of cluster, and returns them.
func relayDeadLetters(t testing.TB, ob *outbox.Outbox, prod *kgo.Client, cluster *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	relay, err := outbox.NewRelay(ob, outbox.WithSender(kafka.DeadLetterKind, kafka.DeadLetterSender(prod)), outbox.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- relay.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-rdone; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	return readRecords(t, cluster, topic, n)
}

// readRecords reads topic of cluster from its start until it has n
// records, and returns them.
func readRecords(t testing.TB, cluster *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	reader, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []*kgo.Record
	for len(got) < n {
		f := reader.PollFetches(ctx)
		if err := f.Err0(); err != nil {
			t.Fatalf("reading %s: %v", topic, err)
		}
		got = append(got, f.Records()...)
	}
	return got
}
