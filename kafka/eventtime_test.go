package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/outbox"
)

// eventTimeHeader is the producer's event-time header of a record at at.
func eventTimeHeader(at time.Time) kgo.RecordHeader {
	return kgo.RecordHeader{Key: adapter.EventTimeHeader, Value: []byte(adapter.FormatEventTime(at))}
}

// of returns the events of type typ.
func (r *recorder) of(typ adapter.EventType) []adapter.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []adapter.Event
	for _, e := range r.events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// consumerMode builds a per-record or a batch consumer that applies
// payments to schema s.
type consumerMode struct {
	name string
	make func(db *sql.DB, mw *idempotent.Middleware, s string, opts ...kafka.Option) (*kafka.Consumer, error)
}

var consumerModes = []consumerMode{
	{"NewConsumer", func(db *sql.DB, mw *idempotent.Middleware, s string, opts ...kafka.Option) (*kafka.Consumer, error) {
		return kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
			return applyPayment(ctx, tx, s, "m", p)
		}), append([]kafka.Option{kafka.WithOffsetsTable(s + ".kafka_offsets")}, opts...)...)
	}},
	{"NewBatchConsumer", func(db *sql.DB, mw *idempotent.Middleware, s string, opts ...kafka.Option) (*kafka.Consumer, error) {
		return kafka.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
			return applyPayments(ctx, tx, s, "m", rs)
		}, append([]kafka.Option{kafka.WithOffsetsTable(s + ".kafka_offsets")}, opts...)...)
	}},
}

// forEachMode runs f for each consumer mode, in parallel.
func forEachMode(t *testing.T, f func(t *testing.T, mode consumerMode)) {
	t.Parallel()
	for _, mode := range consumerModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f(t, mode)
		})
	}
}

// paymentRecord is a payment of 1 to "acct" with key id, and headers.
func paymentRecord(topic, id string, headers ...kgo.RecordHeader) *kgo.Record {
	v, _ := json.Marshal(payment{ID: id, Account: "acct", Amount: 1})
	return &kgo.Record{Topic: topic, Value: v, Headers: append([]kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}, headers...)}
}

// ledgerRows counts the ledger's rows in schema s.
func ledgerRows(t *testing.T, db *sql.DB, s string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ` + s + `.ledger`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// deadLetterRow is a dead letter in the outbox: its payload and the event
// time the row was enqueued with (zero when none).
type deadLetterRow struct {
	kafka.DeadLetter
	EventTime time.Time
}

// deadLetters returns the dead letters in schema s's outbox.
func deadLetters(t *testing.T, db *sql.DB, s string) []deadLetterRow {
	t.Helper()
	rows, err := db.Query(`SELECT payload, event_time FROM ` + s + `.outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []deadLetterRow
	for rows.Next() {
		var p []byte
		var at sql.NullTime
		if err := rows.Scan(&p, &at); err != nil {
			t.Fatal(err)
		}
		var d deadLetterRow
		if err := json.Unmarshal(p, &d.DeadLetter); err != nil {
			t.Fatal(err)
		}
		d.EventTime = at.Time
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// setup is a test's schema, with an account, a cluster with topic, and a
// producer.
func setup(t *testing.T, topic string) (*sql.DB, string, *kgo.Client, []kgo.Opt) {
	t.Helper()
	db := openDB(t, 4)
	s := schema(t, db)
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	cluster := newCluster(t, 1, topic)
	client := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(topic + "-group"), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(50 * time.Millisecond)}
	return db, s, producer(t, cluster), client
}

// TestResendKeepsProducerEventTime is issue 21 case 1: on a claim table
// partitioned by event day, key order-9912 produced at now−24h and re-sent
// at now — a new record, with a new Kafka timestamp, and the producer's
// event-time header of the first — is one Applied and one Duplicate, one
// effect, in both consumers.
func TestResendKeepsProducerEventTime(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode consumerMode) {
		const topic = "orders"
		db, s, prod, client := setup(t, topic)
		mw := newMiddleware(t, db, s, "resend", idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(2))
		now := time.Now()
		first := now.Add(-24 * time.Hour)
		r1 := paymentRecord(topic, "order-9912", eventTimeHeader(first))
		r1.Timestamp = first
		r2 := paymentRecord(topic, "order-9912", eventTimeHeader(first))
		r2.Timestamp = now // the re-send's own timestamp, another UTC day
		if err := prod.ProduceSync(context.Background(), r1, r2).FirstErr(); err != nil {
			t.Fatal(err)
		}
		c, err := mode.make(db, mw, s)
		if err != nil {
			t.Fatal(err)
		}
		m := startMember(c, "m", client...)
		waitFor(t, "both records consumed", func() (bool, error) { return storedOffsets(t, db, s, "resend", topic)[0] == 2, nil })
		m.stop(t)
		st := c.Stats()
		if n := ledgerRows(t, db, s); st.Applied != 1 || st.Duplicates != 1 || n != 1 {
			t.Fatalf("%d applied, %d duplicates, %d ledger rows; want 1, 1 and 1", st.Applied, st.Duplicates, n)
		}
	})
}

// TestPartitionedNeedsProducerEventTime: a consumer that reads no
// producer event time (WithoutEventTime) is refused at construction on a
// claim table partitioned by event day; the header (the default),
// WithEventTime are accepted, the record timestamp (WithTransportEventTime,
// no producer's time: a re-send gets a new one) is refused too; and a
// record without the header is dead-lettered there, nothing written.
func TestPartitionedNeedsProducerEventTime(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode consumerMode) {
		const topic = "noevent"
		db, s, prod, client := setup(t, topic)
		mw := newMiddleware(t, db, s, "noevent", idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(2))
		if _, err := mode.make(db, mw, s, kafka.WithoutEventTime()); !errors.Is(err, adapter.ErrNoProducerEventTime) {
			t.Fatalf("WithoutEventTime on a partitioned table: %v, want adapter.ErrNoProducerEventTime", err)
		}
		if _, err := mode.make(db, mw, s, kafka.WithTransportEventTime()); !errors.Is(err, adapter.ErrNoProducerEventTime) {
			t.Fatalf("WithTransportEventTime on a partitioned table: %v, want adapter.ErrNoProducerEventTime", err)
		}
		if _, err := mode.make(db, mw, s, kafka.WithEventTime(func(*kgo.Record) (time.Time, error) { return time.Now(), nil })); err != nil {
			t.Errorf("WithEventTime on a partitioned table: %v", err)
		}
		ob := newOutbox(t, db, s, "noevent")
		obs := &recorder{}
		c, err := mode.make(db, mw, s, kafka.WithDeadLetter(ob, "dlq"), kafka.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		if err := prod.ProduceSync(context.Background(), paymentRecord(topic, "unstamped"), paymentRecord(topic, "stamped", eventTimeHeader(time.Now()))).FirstErr(); err != nil {
			t.Fatal(err)
		}
		m := startMember(c, "m", client...)
		waitFor(t, "both records consumed", func() (bool, error) { return storedOffsets(t, db, s, "noevent", topic)[0] == 2, nil })
		m.stop(t)
		dl := obs.of(adapter.EventDeadLettered)
		if n := ledgerRows(t, db, s); n != 1 || len(dl) != 1 || whereOf(t, dl[0]).offset != 0 || dl[0].Message.Key != "unstamped" || !errors.Is(dl[0].Err, idempotent.ErrInvalidEventTime) {
			t.Fatalf("%d ledger rows, dead letters %+v; want 1 row and the unstamped record dead-lettered, with its key, with ErrInvalidEventTime", n, dl)
		}
	})
}

// TestFutureDatedRecordDoesNotHoldItsPartition: a record stamped an hour
// ahead of the Middleware's clock (a producer whose clock is off by a time
// zone), followed in its partition by a record of the present: by default
// a partition waits for a record dated ahead no longer than the clock-skew
// margin, so the record an hour ahead is dead-lettered at once, with its
// reason (idempotent.ErrInvalidEventTime) in the dead letter, nothing of it
// written, and the record behind it is applied without any wait for the
// clock. Both consumers. It runs before the parallel tests rather than
// beside them: the coalescing tests' groups form only when their
// partitions' records arrive together, which a busy machine delays.
func TestFutureDatedRecordDoesNotHoldItsPartition(t *testing.T) {
	for _, mode := range consumerModes {
		t.Run(mode.name, func(t *testing.T) {
			const topic = "ahead"
			db, s, prod, client := setup(t, topic)
			clk := testenv.NewClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
			mw := newMiddleware(t, db, s, "ahead", idempotent.WithRetention(72*time.Hour), idempotent.WithClock(clk.Now))
			ob := newOutbox(t, db, s, "ahead")
			obs := &recorder{}
			c, err := mode.make(db, mw, s, kafka.WithDeadLetter(ob, "dlq"), kafka.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			now := clk.Now()
			ahead, normal := paymentRecord(topic, "ahead", eventTimeHeader(now.Add(time.Hour))), paymentRecord(topic, "normal", eventTimeHeader(now.Add(-time.Minute)))
			if err := prod.ProduceSync(context.Background(), ahead, normal).FirstErr(); err != nil {
				t.Fatal(err)
			}
			m := startMember(c, "m", client...)
			waitFor(t, "both records settled", func() (bool, error) {
				if rq := obs.of(adapter.EventRequeued); len(rq) > 0 {
					return false, fmt.Errorf("the record dated an hour ahead was requeued for %v (%v): its partition waits behind it", rq[0].Delay, rq[0].Err)
				}
				return storedOffsets(t, db, s, "ahead", topic)[0] == 2, nil
			})
			m.stop(t)
			if n := ledgerRows(t, db, s); n != 1 {
				t.Fatalf("%d ledger rows, want 1: the normal record's", n)
			}
			dl := obs.of(adapter.EventDeadLettered)
			if len(dl) != 1 || dl[0].Message.Key != "ahead" || !errors.Is(dl[0].Err, idempotent.ErrInvalidEventTime) {
				t.Fatalf("dead-lettered %+v, want the record an hour ahead, with idempotent.ErrInvalidEventTime", dl)
			}
			dls := deadLetters(t, db, s)
			if len(dls) != 1 || dls[0].Offset != 0 || !strings.Contains(dls[0].Error, "in the future") {
				t.Fatalf("dead letters %+v, want the record at offset 0, its error saying it is dated in the future", dls)
			}
			if st := c.Stats(); st.Applied != 1 || st.DeadLettered != 1 || st.Requeued != 0 {
				t.Fatalf("stats %+v, want 1 applied, 1 dead-lettered, no requeue", st)
			}
		})
	}
}

// TestFutureEventTime is issue 21 case 3: a record dated in the future
// within the settle rule's bound (here WithFutureBound's hour, longer than
// the default) waits, in place and with the records behind it, for the
// rule's delay — until the Middleware's clock catches up — and is applied
// once by a member that runs when it has; a record dated beyond the bound
// (a seconds-for-milliseconds mix-up, say) is dead-lettered exactly once,
// with its key and event time, nothing written, and does not stall its
// partition. Both consumers.
func TestFutureEventTime(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode consumerMode) {
		const topic = "future"
		db, s, prod, client := setup(t, topic)
		clk := testenv.NewClock(time.Now())
		mw := newMiddleware(t, db, s, "future", idempotent.WithRetention(72*time.Hour), idempotent.WithClock(clk.Now))
		ob := newOutbox(t, db, s, "future")
		obs := &recorder{}
		c, err := mode.make(db, mw, s, kafka.WithDeadLetter(ob, "dlq"), kafka.WithObserver(obs),
			kafka.WithRetryDelay(5*time.Millisecond, 20*time.Millisecond), kafka.WithFutureBound(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		now := clk.Now()
		far, soon, past := now.Add(48*time.Hour), now.Add(30*time.Minute), now.Add(-time.Minute)
		var recs []*kgo.Record
		for _, x := range []struct {
			id string
			at time.Time
		}{{"far", far}, {"soon", soon}, {"past", past}} {
			r := paymentRecord(topic, x.id, eventTimeHeader(x.at))
			r.Timestamp = x.at
			recs = append(recs, r)
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		m := startMember(c, "m", client...)
		waitFor(t, "the far record dead-lettered and the soon one requeued", func() (bool, error) {
			stored := storedOffsets(t, db, s, "future", topic)[0]
			if stored > 1 {
				return false, fmt.Errorf("stored offset %d before the clock caught up: the record dated 30 minutes ahead was settled, not requeued", stored)
			}
			return stored == 1 && len(obs.of(adapter.EventRequeued)) >= 1, nil
		})
		m.stop(t)
		if n := ledgerRows(t, db, s); n != 0 {
			t.Fatalf("%d ledger rows before the clock caught up, want 0", n)
		}
		// The rule's delay: until the clock reaches the event time, less the
		// clock-skew margin.
		wait := soon.Sub(now) - mw.Config().ClockSkew
		rq := obs.of(adapter.EventRequeued)
		for _, e := range rq {
			if whereOf(t, e).offset != 1 || e.Message.Key != "soon" || !e.Message.EventTime.Equal(soon) || e.Attempt != 1 ||
				!errors.Is(e.Err, idempotent.ErrInvalidEventTime) || e.Delay != wait {
				t.Fatalf("requeued %+v: want soon's at offset 1, attempt 1, with ErrInvalidEventTime, after the rule's %v", e, wait)
			}
		}
		if len(rq) != 1 {
			t.Fatalf("%d requeues before the clock moved, want 1 (the record waits the rule's delay)", len(rq))
		}
		if rel := obs.of(adapter.EventReleased); len(rel) < 1 || rel[0].Message.Key != "soon" || rel[0].Err != nil {
			t.Fatalf("released %+v at the stop, want soon first, with no error", rel)
		}
		clk.Add(31 * time.Minute)
		m = startMember(c, "m", client...)
		waitFor(t, "every record consumed", func() (bool, error) { return storedOffsets(t, db, s, "future", topic)[0] == 3, nil })
		m.stop(t)
		dls := deadLetters(t, db, s)
		if n := ledgerRows(t, db, s); n != 2 || len(dls) != 1 || dls[0].Offset != 0 || dls[0].EventTime.Sub(far).Abs() >= time.Microsecond {
			t.Fatalf("%d ledger rows, dead letters %+v; want 2 rows and one dead letter, of the far record with its event time (to the microsecond, as Postgres keeps it)", n, dls)
		}
		if dl := obs.of(adapter.EventDeadLettered); len(dl) != 1 || dl[0].Message.Key != "far" || recordOf(dl[0]) == nil || recordOf(dl[0]).Offset != 0 {
			t.Fatalf("dead-lettered %+v, want far's, with its key and record", dl)
		}
		if st := c.Stats(); st.Applied != 2 || st.DeadLettered != 1 || st.Requeued != 1 {
			t.Fatalf("stats %+v, want 2 applied, 1 dead-lettered, 1 requeued", st)
		}
	})
}

// TestBadEventTimeHeader: a record whose event-time header is not an RFC
// 3339 time (a day name, epoch milliseconds) is poison — dead-lettered
// once with adapter.ErrBadEventTime, nothing written — and the records
// behind it apply.
func TestBadEventTimeHeader(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode consumerMode) {
		const topic = "badtime"
		db, s, prod, client := setup(t, topic)
		mw := newMiddleware(t, db, s, "badtime", idempotent.WithRetention(72*time.Hour))
		ob := newOutbox(t, db, s, "badtime")
		obs := &recorder{}
		c, err := mode.make(db, mw, s, kafka.WithDeadLetter(ob, "dlq"), kafka.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		bad := func(v string) kgo.RecordHeader {
			return kgo.RecordHeader{Key: adapter.EventTimeHeader, Value: []byte(v)}
		}
		if err := prod.ProduceSync(context.Background(),
			paymentRecord(topic, "word", bad("yesterday")),
			paymentRecord(topic, "millis", bad("1764547200000")),
			paymentRecord(topic, "good", eventTimeHeader(time.Now().Add(-time.Hour))),
		).FirstErr(); err != nil {
			t.Fatal(err)
		}
		m := startMember(c, "m", client...)
		waitFor(t, "every record consumed", func() (bool, error) { return storedOffsets(t, db, s, "badtime", topic)[0] == 3, nil })
		m.stop(t)
		dl := obs.of(adapter.EventDeadLettered)
		if n := ledgerRows(t, db, s); n != 1 || len(dl) != 2 || len(deadLetters(t, db, s)) != 2 {
			t.Fatalf("%d ledger rows, dead-letter events %+v; want 1 row and 2 dead letters", n, dl)
		}
		for i, e := range dl {
			if !errors.Is(e.Err, adapter.ErrBadEventTime) || !errors.Is(e.Err, idempotent.ErrInvalidEventTime) {
				t.Errorf("dead letter at %s: %v, want adapter.ErrBadEventTime", e.Source, e.Err)
			}
			if want := []string{"word", "millis"}[i]; e.Message.Key != want {
				t.Errorf("dead letter at %s: key %q, want %q", e.Source, e.Message.Key, want)
			}
		}
	})
}

// TestDeadLetterSenderCarriesEventTime is the dead-letter half of issue
// 21 case 1: DeadLetterSender sets the event-time header from the outbox
// row's event time — on a dead letter whose record had its event time from
// elsewhere, in place of the one an original had (once) — and keeps the
// original's headers as they were when the row has none, so that a replay
// from the dead-letter topic is claimed on its first day.
func TestDeadLetterSenderCarriesEventTime(t *testing.T) {
	t.Parallel()
	cluster := newCluster(t, 1, "dlq")
	prod := producer(t, cluster)
	at := time.Date(2026, 11, 29, 23, 59, 0, 0, time.UTC)
	send := kafka.DeadLetterSender(prod)
	bad := kgo.RecordHeader{Key: adapter.EventTimeHeader, Value: []byte("yesterday")}
	want := map[string][]string{}
	for i, c := range []struct {
		value   string
		headers []kgo.RecordHeader
		at      time.Time
		want    []string
	}{
		{"from the timestamp", nil, at, []string{adapter.FormatEventTime(at)}},
		{"from the header", []kgo.RecordHeader{eventTimeHeader(at)}, at, []string{adapter.FormatEventTime(at)}},
		{"from a function, another header", []kgo.RecordHeader{eventTimeHeader(at.Add(time.Hour))}, at, []string{adapter.FormatEventTime(at)}},
		{"none: a bad header kept", []kgo.RecordHeader{bad}, time.Time{}, []string{"yesterday"}},
	} {
		p, _ := json.Marshal(kafka.DeadLetter{Topic: "dlq", SourceTopic: "in", Offset: int64(i), Value: []byte(c.value), Headers: c.headers, Timestamp: at})
		if err := send.Send(context.Background(), outbox.Message{ID: int64(i), IdempotencyKey: "k", Payload: p, EventTime: c.at}); err != nil {
			t.Fatal(err)
		}
		want[c.value] = c.want
	}
	got := readRecords(t, cluster, "dlq", len(want))
	for _, r := range got {
		var vals []string
		for _, h := range r.Headers {
			if h.Key == adapter.EventTimeHeader {
				vals = append(vals, string(h.Value))
			}
		}
		if !slices.Equal(vals, want[string(r.Value)]) {
			t.Errorf("dead letter %q: event-time headers %q, want %q", r.Value, vals, want[string(r.Value)])
		}
	}
}
