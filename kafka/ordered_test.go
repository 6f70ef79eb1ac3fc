package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
)

// orderedRecord is sequence seq of entity under the idempotency key key,
// on partition p, with record key recordKey: its body "entity:seq" and a
// header of the producer's own ("kind").
func orderedRecord(topic string, p int32, recordKey, key, entity string, seq int64) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: p, Key: []byte(recordKey), Value: []byte(entity + ":" + strconv.FormatInt(seq, 10)),
		Headers: []kgo.RecordHeader{
			{Key: kafka.DefaultKeyHeader, Value: []byte(key)},
			{Key: adapter.OrderKeyHeader, Value: []byte(entity)},
			{Key: adapter.OrderSeqHeader, Value: []byte(adapter.FormatOrderSeq(seq))},
			{Key: "kind", Value: []byte("kind-" + strconv.FormatInt(seq, 10))},
		}}
}

// orderedLedger is the effect of the ordered tests: a row per applied
// record (entity, seq, its "kind" header), in the order applied.
type orderedLedger struct {
	db    *sql.DB
	table string
}

func (l orderedLedger) apply(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
	entity, seq, _ := strings.Cut(string(r.Value), ":")
	kind := ""
	for _, h := range r.Headers {
		if h.Key == "kind" {
			kind = string(h.Value)
		}
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+l.table+" (entity, seq, kind) VALUES ($1, $2, $3)", entity, seq, kind)
	return err
}

// applied returns entity's rows as "seq/kind", in the order applied.
func (l orderedLedger) applied(t testing.TB, entity string) []string {
	t.Helper()
	rows, err := l.db.Query("SELECT seq || '/' || kind FROM "+l.table+" WHERE entity = $1 ORDER BY pos", entity)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOrderedRecords: on a Middleware created WithOrdering, per record
// and in batches, a record whose ordering key is not its record key
// arrives on another partition before its predecessor: it is parked, with
// its headers, and its offset advances with the park (the partition reads
// on; a restart does not read it again). When the predecessor applies, on
// the other partition, the parked record applies after it, from what was
// parked (kafka.ParkedRecord). A re-send of an applied sequence under a
// new key and a redelivery of the parked record's key (a dead-letter
// replay, a producer's retry) are duplicates: nothing applies again, and
// their offsets advance too.
func TestOrderedRecords(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			db := openDB(t, 8)
			s := schema(t, db)
			l := orderedLedger{db: db, table: s + ".ordered"}
			if _, err := db.Exec("CREATE TABLE " + l.table + " (pos serial PRIMARY KEY, entity text NOT NULL, seq int NOT NULL, kind text NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			var outs outcomes
			mw := newMiddleware(t, db, s, "ordered", idempotent.WithObserver(&outs), idempotent.WithOrdering(idempotent.Ordering{
				Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
					return l.apply(ctx, tx, kafka.ParkedRecord(p))
				},
			}))
			const topic = "ledger"
			cluster := newCluster(t, 2, topic)
			prod := producer(t, cluster)
			produce := func(rs ...*kgo.Record) {
				t.Helper()
				if err := prod.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			var ev counter
			opts := []kafka.Option{kafka.WithOffsetsTable(s + ".kafka_offsets"), kafka.WithObserver(&ev), kafka.WithWorkers(2)}
			newConsumer := func() *kafka.Consumer {
				t.Helper()
				var c *kafka.Consumer
				var err error
				if batch {
					c, err = kafka.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
						for _, r := range rs {
							if err := l.apply(ctx, tx, r); err != nil {
								return err
							}
						}
						return nil
					}, append(opts, kafka.WithBatchSize(10))...)
				} else {
					c, err = kafka.NewConsumer(mw, l.apply, opts...)
				}
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			group := "ordered-" + strconv.FormatBool(batch)
			clientOpts := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic)}
			settled := func() int { return ev.get(adapter.EventApplied) + ev.get(adapter.EventDuplicate) }

			// Sequence 2 first, on partition 0.
			produce(orderedRecord(topic, 0, "acct", "acct-2", "acct", 2))
			m := startMember(newConsumer(), "first", clientOpts...)
			waitFor(t, "the early record settled", func() (bool, error) { return settled() == 1, nil })
			if got := l.applied(t, "acct"); len(got) != 0 {
				t.Errorf("applied %v before sequence 1", got)
			}
			if got := outs.of("acct-2"); !slices.Equal(got, []idempotent.Outcome{idempotent.Parked}) {
				t.Errorf("outcomes of the early record: %v, want parked", got)
			}
			if off := storedOffsets(t, db, s, "ordered", topic); off[0] != 1 {
				t.Errorf("stored offsets %v: want partition 0 at 1, the parked record's offset advanced with its park", off)
			}
			if w, err := mw.Waiting(context.Background()); err != nil || len(w) != 1 || w[0].OrderKey != "acct" {
				t.Errorf("Waiting = %+v, %v; want acct's parked record", w, err)
			}
			m.stop(t)

			// A restart reads from the stored offsets: the parked record is
			// not read again. Sequence 1 arrives on partition 1 and
			// releases 2; then a re-send of sequence 1 under a new key and
			// a redelivery of sequence 2's key, on partition 0.
			produce(orderedRecord(topic, 1, "other", "acct-1", "acct", 1))
			m = startMember(newConsumer(), "second", clientOpts...)
			waitFor(t, "sequence 1 applied", func() (bool, error) { return settled() == 2, nil })
			produce(orderedRecord(topic, 0, "acct", "acct-1-resent", "acct", 1), orderedRecord(topic, 0, "acct", "acct-2", "acct", 2))
			waitFor(t, "the re-sends settled", func() (bool, error) { return settled() == 4, nil })
			m.stop(t)

			if got, want := l.applied(t, "acct"), []string{"1/kind-1", "2/kind-2"}; !slices.Equal(got, want) {
				t.Errorf("applied %v, want %v: in sequence order, once each, the parked record with its headers", got, want)
			}
			if got := outs.of("acct-2"); !slices.Equal(got, []idempotent.Outcome{idempotent.Parked, idempotent.Applied, idempotent.Duplicate}) {
				t.Errorf("outcomes of sequence 2's key: %v, want parked, applied (released), then a duplicate", got)
			}
			if got := outs.of("acct-1-resent"); !slices.Equal(got, []idempotent.Outcome{idempotent.Duplicate}) {
				t.Errorf("outcomes of the re-sent sequence 1: %v, want a duplicate", got)
			}
			if off := storedOffsets(t, db, s, "ordered", topic); off[0] != 3 || off[1] != 1 {
				t.Errorf("stored offsets %v: want partition 0 at 3 and partition 1 at 1", off)
			}
			if w, err := mw.Waiting(context.Background()); err != nil || len(w) != 0 {
				t.Errorf("Waiting = %+v, %v; want nothing parked", w, err)
			}
		})
	}
}

// TestOrderedRecordsInPartitionOrder: records keyed by their entity share
// a partition, and a partition applies in offset order: many entities'
// sequences, produced in order and interleaved on two partitions, apply
// in order and none parks.
func TestOrderedRecordsInPartitionOrder(t *testing.T) {
	t.Parallel()
	db := openDB(t, 8)
	s := schema(t, db)
	l := orderedLedger{db: db, table: s + ".ordered"}
	if _, err := db.Exec("CREATE TABLE " + l.table + " (pos serial PRIMARY KEY, entity text NOT NULL, seq int NOT NULL, kind text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var outs outcomes
	mw := newMiddleware(t, db, s, "ordered", idempotent.WithObserver(&outs), idempotent.WithOrdering(idempotent.Ordering{
		Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			return l.apply(ctx, tx, kafka.ParkedRecord(p))
		},
	}))
	const topic, entities, seqs = "ledger", 8, 5
	cluster := newCluster(t, 2, topic)
	prod := producer(t, cluster)
	var rs []*kgo.Record
	for seq := int64(1); seq <= seqs; seq++ {
		for i := range entities {
			entity := "acct" + strconv.Itoa(i)
			rs = append(rs, orderedRecord(topic, int32(i%2), entity, fmt.Sprintf("%s-%d", entity, seq), entity, seq))
		}
	}
	if err := prod.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var ev counter
	c, err := kafka.NewConsumer(mw, l.apply, kafka.WithOffsetsTable(s+".kafka_offsets"), kafka.WithObserver(&ev), kafka.WithWorkers(2))
	if err != nil {
		t.Fatal(err)
	}
	m := startMember(c, "only", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("ordered"), kgo.ConsumeTopics(topic))
	waitFor(t, "every record applied", func() (bool, error) { return ev.get(adapter.EventApplied) == len(rs), nil })
	m.stop(t)
	for i := range entities {
		entity := "acct" + strconv.Itoa(i)
		if got := l.applied(t, entity); len(got) != seqs || !slices.IsSortedFunc(got, func(a, b string) int { return strings.Compare(a, b) }) {
			t.Errorf("entity %s: applied %v, want 1..%d in order", entity, got, seqs)
		}
	}
	if n := outs.count(idempotent.Parked); n != 0 {
		t.Errorf("%d records parked: a partition's records of one entity must apply in order", n)
	}
}

// outcomes records the Middleware's outcome of every key, in order.
type outcomes struct {
	mu  sync.Mutex
	all map[string][]idempotent.Outcome
}

func (o *outcomes) Retry(context.Context, idempotent.RetryEvent) {}

func (o *outcomes) Outcome(_ context.Context, e idempotent.Event) {
	if e.Err != nil || e.Key == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.all == nil {
		o.all = map[string][]idempotent.Outcome{}
	}
	o.all[e.Key] = append(o.all[e.Key], e.Outcome)
}

func (o *outcomes) of(key string) []idempotent.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.all[key])
}

func (o *outcomes) count(out idempotent.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, outs := range o.all {
		for _, x := range outs {
			if x == out {
				n++
			}
		}
	}
	return n
}

// TestOrderedBadHeaders: a record whose ordering headers cannot be used —
// a sequence that is not a number, a sequence 0, an ordering key without a
// sequence — is poison, per record and in batches: dropped (no dead-letter
// outbox) with an error matching idempotent.ErrInvalidOrder that names the
// header, its offset advanced, and nothing else written: no claim, no
// sequence row, nothing parked, no effect. The good record after them
// applies.
func TestOrderedBadHeaders(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			db := openDB(t, 4)
			s := schema(t, db)
			mw := newMiddleware(t, db, s, "ordered", idempotent.WithOrdering(idempotent.Ordering{
				Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return errors.New("nothing may park") },
			}))
			const topic = "ledger"
			cluster := newCluster(t, 1, topic)
			bad := func(key string, headers ...kgo.RecordHeader) *kgo.Record {
				return &kgo.Record{Topic: topic, Value: []byte("{}"), Headers: append([]kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(key)}}, headers...)}
			}
			rs := []*kgo.Record{
				bad("bad-nan", kgo.RecordHeader{Key: adapter.OrderKeyHeader, Value: []byte("acct")}, kgo.RecordHeader{Key: adapter.OrderSeqHeader, Value: []byte("x")}),
				bad("bad-zero", kgo.RecordHeader{Key: adapter.OrderKeyHeader, Value: []byte("acct")}, kgo.RecordHeader{Key: adapter.OrderSeqHeader, Value: []byte("0")}),
				bad("bad-noseq", kgo.RecordHeader{Key: adapter.OrderKeyHeader, Value: []byte("acct")}),
				orderedRecord(topic, 0, "acct", "good", "acct", 1),
			}
			if err := producer(t, cluster).ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var handled []string
			one := func(_ context.Context, _ *sql.Tx, r *kgo.Record) error {
				mu.Lock()
				defer mu.Unlock()
				for _, h := range r.Headers {
					if h.Key == kafka.DefaultKeyHeader {
						handled = append(handled, string(h.Value))
					}
				}
				return nil
			}
			var dmu sync.Mutex
			var dropped []error
			opts := []kafka.Option{kafka.WithOffsetsTable(s + ".kafka_offsets"), kafka.WithObserver(adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
				if e.Type == adapter.EventDeadLettered {
					dmu.Lock()
					dropped = append(dropped, e.Err)
					dmu.Unlock()
				}
			}))}
			var c *kafka.Consumer
			var err error
			if batch {
				c, err = kafka.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
					for _, r := range rs {
						if err := one(ctx, tx, r); err != nil {
							return err
						}
					}
					return nil
				}, append(opts, kafka.WithBatchSize(10))...)
			} else {
				c, err = kafka.NewConsumer(mw, one, opts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			m := startMember(c, "only", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("ordered"), kgo.ConsumeTopics(topic))
			waitFor(t, "every record settled", func() (bool, error) {
				return storedOffsets(t, db, s, "ordered", topic)[0] == int64(len(rs)), nil
			})
			m.stop(t)
			mu.Lock()
			if !slices.Equal(handled, []string{"good"}) {
				t.Errorf("handled %v, want only the good record", handled)
			}
			mu.Unlock()
			dmu.Lock()
			defer dmu.Unlock()
			if len(dropped) != 3 {
				t.Fatalf("%d records dropped, want the 3 bad ones", len(dropped))
			}
			for _, err := range dropped {
				if !errors.Is(err, idempotent.ErrInvalidOrder) {
					t.Errorf("dropped with %v, want ErrInvalidOrder", err)
				}
				t.Logf("dropped: %v", err)
			}
			for table, want := range map[string]int{"processed_messages": 1, "processed_messages_order_seq": 1, "processed_messages_order_parked": 0} {
				var n int
				if err := db.QueryRow("SELECT COUNT(*) FROM " + s + "." + table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != want {
					t.Errorf("%s holds %d rows, want %d (the good record's only)", table, n, want)
				}
			}
		})
	}
}
