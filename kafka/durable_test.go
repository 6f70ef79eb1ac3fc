package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/kafkaoffsets"
	"github.com/txclaim/idempotent/kafka"
)

// The tests of this file are issue 20's cases 2, 4 and 5 for the Kafka
// consumer: its positions come from the database only, a log that lost
// records under the stored offset stops the partition, aborted Kafka
// transactions are not applied, and its transactions run on the
// Middleware's own claim path (transaction options, strict guard) without
// the duplicate pre-check.

// recorder is an adapter.Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []adapter.Event
}

func (r *recorder) Observe(_ context.Context, e adapter.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// first returns the first event of type typ.
func (r *recorder) first(typ adapter.EventType) (adapter.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Type == typ {
			return e, true
		}
	}
	return adapter.Event{}, false
}

// summary lists the events other than assignments and revocations, for a
// failure message.
func (r *recorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		switch e.Type {
		case adapter.EventAssigned, adapter.EventRevoked, adapter.EventLost:
			continue
		}
		s := fmt.Sprintf("%v %s", e.Type, e.Source)
		if e.Err != nil {
			s += fmt.Sprintf(" (%v)", e.Err)
		}
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}

// durable is one test's database schema, claim table, cluster and topic.
type durable struct {
	t        *testing.T
	db       *sql.DB
	s        string
	consumer string
	topic    string
	cluster  *kfake.Cluster
	prod     *kgo.Client
}

func newDurable(t *testing.T, consumer, topic string) *durable {
	t.Helper()
	db := openDB(t, 4)
	s := schema(t, db)
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	cluster := newCluster(t, 1, topic)
	return &durable{t: t, db: db, s: s, consumer: consumer, topic: topic, cluster: cluster, prod: producer(t, cluster)}
}

// send produces one payment record per id, keyed by it, and returns the
// offset of the last.
func (d *durable) send(ids ...string) int64 {
	d.t.Helper()
	var last int64
	for _, id := range ids {
		last = produceTo(d.t, d.prod, d.topic, id)
	}
	return last
}

func produceTo(t *testing.T, cl *kgo.Client, topic, id string) int64 {
	t.Helper()
	v, _ := json.Marshal(payment{ID: id, Account: "acct", Amount: 1})
	r, err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: v,
		Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}}).First()
	if err != nil {
		t.Fatal(err)
	}
	return r.Offset
}

func ids(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

func (d *durable) clientOpts(group string) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(d.cluster.ListenAddrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(d.topic),
		kgo.FetchMaxWait(50 * time.Millisecond)}
}

// newConsumer returns a record consumer of mw (or, batch, a batch consumer
// that runs one on each record of its batch, a poison error naming the
// record's index): one is d.pay when nil.
func (d *durable) newConsumer(mw *idempotent.Middleware, batch bool, one kafka.Handler, opts ...kafka.Option) *kafka.Consumer {
	d.t.Helper()
	if one == nil {
		one = d.pay
	}
	opts = append([]kafka.Option{kafka.WithOffsetsTable(d.s + ".kafka_offsets"), kafka.WithRetryDelay(5*time.Millisecond, 50*time.Millisecond)}, opts...)
	var c *kafka.Consumer
	var err error
	if batch {
		c, err = kafka.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
			for i, r := range rs {
				if err := one(ctx, tx, r); err != nil {
					if adapter.IsPoison(err) {
						return adapter.PoisonItem(i, err)
					}
					return err
				}
			}
			return nil
		}, opts...)
	} else {
		c, err = kafka.NewConsumer(mw, one, opts...)
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return c
}

// pay applies a payment record to the ledger.
func (d *durable) pay(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
	p, err := kafka.JSON[payment](r.Value)
	if err != nil {
		return err // poison: adapter.ErrUndecodable
	}
	return applyPayment(ctx, tx, d.s, "m", p)
}

// eachConsumer runs f as a subtest for the record consumer and for the
// batch consumer.
func eachConsumer(t *testing.T, f func(t *testing.T, batch bool)) {
	t.Helper()
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "record", true: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			f(t, batch)
		})
	}
}

// stored returns the stored offset of partition 0, -1 when there is none.
func (d *durable) stored() int64 {
	d.t.Helper()
	o, ok := storedOffsets(d.t, d.db, d.s, d.consumer, d.topic)[0]
	if !ok {
		return -1
	}
	return o
}

// applied returns how many times each payment id was applied.
func (d *durable) applied() map[string]int { return appliedCounts(d.t, d.db, d.s) }

// wantApplied fails unless exactly want were applied, each once.
func (d *durable) wantApplied(what string, want []string) {
	wantAppliedOnce(d.t, d.db, d.s, what, want)
}

// appliedCounts returns how many times each payment id was applied to the
// ledger of schema s.
func appliedCounts(t testing.TB, db *sql.DB, s string) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT id, count(*) FROM ` + s + `.ledger GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// wantAppliedOnce fails unless exactly want were applied to the ledger of
// schema s, each once.
func wantAppliedOnce(t testing.TB, db *sql.DB, s, what string, want []string) {
	t.Helper()
	got := appliedCounts(t, db, s)
	var wrong []string
	for _, id := range want {
		if got[id] != 1 {
			wrong = append(wrong, fmt.Sprintf("%s applied %d times", id, got[id]))
		}
		delete(got, id)
	}
	for id, n := range got {
		wrong = append(wrong, fmt.Sprintf("%s applied %d times, want never", id, n))
	}
	if len(wrong) > 0 {
		slices.Sort(wrong)
		t.Fatalf("%s: %s", what, strings.Join(wrong, ", "))
	}
}

// run consumes with c until cond holds, then stops the member.
func (d *durable) run(c *kafka.Consumer, group, what string, cond func() bool) {
	d.t.Helper()
	m := startMember(c, group, d.clientOpts(group)...)
	waitFor(d.t, what, func() (bool, error) { return cond(), nil })
	m.stop(d.t)
}

// runUntilStopped runs a consumer of mw until partition 0 stops or its
// stored offset moves from stored, and fails unless it stopped with a
// *kafka.LogGapError at stored (why says what happened to the log), the
// stored offset unchanged.
func (d *durable) runUntilStopped(mw *idempotent.Middleware, batch bool, stored int64, why string) (adapter.Event, *kafka.LogGapError) {
	d.t.Helper()
	obs := &recorder{}
	d.run(d.newConsumer(mw, batch, nil, kafka.WithObserver(obs)), d.consumer, "the partition to stop, or its offset to move", func() bool {
		_, stopped := obs.first(adapter.EventStopped)
		return stopped || d.stored() != stored
	})
	e, ok := obs.first(adapter.EventStopped)
	if !ok {
		d.t.Fatalf("no EventStopped after %s: stored offset %d, applied %v; events: %s", why, d.stored(), d.applied(), obs.summary())
	}
	gap := d.wantGap(e, stored)
	if got := d.stored(); got != stored {
		d.t.Errorf("stored offset %d after the stop, want %d (unchanged)", got, stored)
	}
	return e, gap
}

// wantGap fails unless e is an EventStopped of partition 0 whose error is a
// *kafka.LogGapError with the stored offset stored, and returns the error.
func (d *durable) wantGap(e adapter.Event, stored int64) *kafka.LogGapError {
	d.t.Helper()
	var gap *kafka.LogGapError
	if !errors.As(e.Err, &gap) || !errors.Is(e.Err, kafka.ErrLogGap) {
		d.t.Fatalf("EventStopped with %v, want a *kafka.LogGapError", e.Err)
	}
	if at := whereOf(d.t, e); at != (where{d.topic, 0, stored}) || gap.Topic != d.topic || gap.Partition != 0 || gap.Stored != stored {
		d.t.Fatalf("EventStopped at %s with %+v, want %s/0 at the stored offset %d", e.Source, gap, d.topic, stored)
	}
	msg := e.Err.Error()
	for _, want := range []string{fmt.Sprintf("%q", d.topic), "partition 0", fmt.Sprintf("stored offset %d", stored)} {
		if !strings.Contains(msg, want) {
			d.t.Errorf("the error %q does not name %s", msg, want)
		}
	}
	return gap
}

// TestTopicRecreatedStopsPartition: a topic applied to offset 10 is deleted
// and re-created, and 15 records are produced to the new one (offsets 0 to
// 14). The consumer, started again, must not seek to the stored 10 and skip
// the first ten of the new topic: the topic ID stored with the offset is not
// the new topic's, so it stops the partition, applies nothing and tells the
// observer. After a deliberate reset of the stored offset to 0 (what
// "idempotent kafka-offsets reset" does), all 15 are applied, once.
func TestTopicRecreatedStopsPartition(t *testing.T) {
	t.Parallel()
	d := newDurable(t, "recreate", "recreated")
	mw := newMiddleware(t, d.db, d.s, d.consumer)
	d.send(ids("r", 0, 10)...)
	c := d.newConsumer(mw, false, nil)
	d.run(c, "recreate", "the old topic applied", func() bool { return d.stored() == 10 })

	if err := d.cluster.DeleteTopic(d.topic); err != nil {
		t.Fatal(err)
	}
	if err := d.cluster.CreateTopic(d.topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	d.prod = producer(t, d.cluster) // the first producer holds the old topic's ID and refuses the new one
	d.send(ids("n", 0, 15)...)

	e, gap := d.runUntilStopped(mw, false, 10, "the topic was re-created")
	if gap.StoredTopicID == "" || gap.TopicID == "" || gap.StoredTopicID == gap.TopicID || !strings.Contains(e.Err.Error(), "re-created") {
		t.Errorf("the error %q (stored topic ID %q, fetched %q) does not say the topic was re-created", e.Err, gap.StoredTopicID, gap.TopicID)
	}
	d.wantApplied("after the stop", ids("r", 0, 10))

	q, err := kafkaoffsets.New(d.s + ".kafka_offsets")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := kafkaoffsets.Reset(context.Background(), d.db, q, d.consumer, d.topic, 0, 0); err != nil {
		t.Fatal(err)
	}
	c = d.newConsumer(mw, false, nil)
	d.run(c, "recreate", "the new topic applied after the reset", func() bool { return d.stored() == 15 })
	d.wantApplied("after the reset", append(ids("r", 0, 10), ids("n", 0, 15)...))
}

// TestRecordsDeletedBelowStoredOffset: records 0 to 4 are applied (stored
// offset 5), 5 to 9 are produced, and DeleteRecords moves the log start to
// 8 before the consumer runs again. The client would start at 8 and skip 5,
// 6 and 7 for good; the consumer sees the log start above its stored offset
// and stops the partition instead, applying nothing of it.
func TestRecordsDeletedBelowStoredOffset(t *testing.T) {
	t.Parallel()
	eachConsumer(t, func(t *testing.T, batch bool) {
		d := newDurable(t, "deleted", "deleted")
		mw := newMiddleware(t, d.db, d.s, d.consumer)
		d.send(ids("d", 0, 5)...)
		d.run(d.newConsumer(mw, batch, nil), "deleted", "records 0 to 4 applied", func() bool { return d.stored() == 5 })
		d.send(ids("d", 5, 10)...)
		if err := d.cluster.DeleteRecords(d.topic, 0, 8); err != nil {
			t.Fatal(err)
		}

		e, gap := d.runUntilStopped(mw, batch, 5, "records 5 to 7 were deleted")
		if gap.LogStart != 8 || !strings.Contains(e.Err.Error(), "records 5 to 7 were deleted") {
			t.Errorf("LogStart %d, error %q; want 8 and the deleted records named", gap.LogStart, e.Err)
		}
		d.wantApplied("after the stop", ids("d", 0, 5))
	})
}

// TestAbortedTransactionNotApplied: between two committed records, a
// transactional producer writes three records and aborts. The consumer
// reads committed records only: the aborted three are never applied, and
// the gap they and the abort marker leave in the offsets (the record after
// them is above the stored offset) is not mistaken for lost records.
func TestAbortedTransactionNotApplied(t *testing.T) {
	t.Parallel()
	eachConsumer(t, func(t *testing.T, batch bool) {
		d := newDurable(t, "aborted", "aborted")
		mw := newMiddleware(t, d.db, d.s, d.consumer)
		txp, err := kgo.NewClient(kgo.SeedBrokers(d.cluster.ListenAddrs()...), kgo.TransactionalID("aborter"),
			kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(txp.Close)
		obs := &recorder{}
		m := startMember(d.newConsumer(mw, batch, nil, kafka.WithObserver(obs)), "aborted", d.clientOpts("aborted")...)
		d.send("c-0")
		waitFor(t, "c-0 applied", func() (bool, error) { return d.stored() == 1, nil })

		ctx := context.Background()
		if err := txp.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids("a", 0, 3) {
			produceTo(t, txp, d.topic, id)
		}
		if err := txp.EndTransaction(ctx, kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
		last := d.send("c-1")
		waitFor(t, "c-1 applied", func() (bool, error) { return d.stored() == last+1, nil })
		m.stop(t)
		if _, stopped := obs.first(adapter.EventStopped); stopped {
			t.Fatalf("the partition stopped; events: %s", obs.summary())
		}
		d.wantApplied("after an aborted transaction", []string{"c-0", "c-1"})
	})
}

// firstFetch returns an observer option and a channel: once the consumer
// is assigned its partitions, the channel reports the offset of partition 0
// of topic in the first fetch that reaches the cluster: where the consumer
// begins. The fetches before the assignment — a stopped client's last long
// poll, woken late — are passed over.
func firstFetch(t *testing.T, cluster *kfake.Cluster, topic string) (kafka.Option, <-chan int64) {
	t.Helper()
	info := cluster.TopicInfo(topic)
	if info == nil {
		t.Fatalf("no topic %s", topic)
	}
	ch := make(chan int64, 1)
	var once sync.Once
	arm := func() {
		cluster.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
			for _, rt := range req.(*kmsg.FetchRequest).Topics {
				if rt.Topic != topic && rt.TopicID != info.TopicID {
					continue
				}
				for _, rp := range rt.Partitions {
					if rp.Partition == 0 {
						ch <- rp.FetchOffset
						cluster.DropControl()
						return nil, nil, false
					}
				}
			}
			return nil, nil, false
		})
	}
	// The observer runs in the client's assignment, before it fetches.
	return kafka.WithObserver(adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
		if e.Type == adapter.EventAssigned {
			once.Do(arm)
		}
	})), ch
}

func startedAt(t *testing.T, ch <-chan int64) int64 {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(time.Minute):
		t.Fatal("the consumer never fetched the partition")
		return 0
	}
}

// TestRestoreWithoutOffsetsRow: ten records are applied and their offsets
// committed to Kafka too; then the database is restored to a point before
// the first (no offsets row, no claims, no effects). The consumer must start
// from the reset position — the log start by default, so that all ten and
// the record produced since apply again — never from Kafka's committed
// offset, which the restore did not roll back; only WithAdoptGroupOffsets
// takes that one, and WithResetPosition(ResetLatest) starts at the end.
func TestRestoreWithoutOffsetsRow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opt     kafka.Option
		startAt int64
		want    []string
	}{
		{"default earliest", nil, 0, ids("o", 0, 11)},
		{"adopt group offsets", kafka.WithAdoptGroupOffsets(), 10, []string{"o-10"}},
		{"latest", kafka.WithResetPosition(kafka.ResetLatest), 11, []string{"o-11"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDurable(t, "restore", "restore")
			mw := newMiddleware(t, d.db, d.s, d.consumer)
			d.send(ids("o", 0, 10)...)
			d.run(d.newConsumer(mw, false, nil), "restore", "ten records applied", func() bool { return d.stored() == 10 })
			for _, q := range []string{`DELETE FROM ` + d.s + `.kafka_offsets`, `DELETE FROM ` + d.s + `.processed_messages`, `DELETE FROM ` + d.s + `.ledger`} {
				if _, err := d.db.Exec(q); err != nil {
					t.Fatal(err)
				}
			}
			d.send("o-10")

			watch, started := firstFetch(t, d.cluster, d.topic)
			opts := []kafka.Option{watch}
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			m := startMember(d.newConsumer(mw, false, nil, opts...), "restore", d.clientOpts("restore")...)
			if got := startedAt(t, started); got != tc.startAt {
				m.stop(t)
				t.Fatalf("after the restore the consumer started at offset %d, want %d; applied %v", got, tc.startAt, d.applied())
			}
			last := int64(10)
			if tc.startAt == 11 {
				last = d.send("o-11")
			}
			waitFor(t, "the partition applied to its end", func() (bool, error) { return d.stored() == last+1, nil })
			m.stop(t)
			d.wantApplied("after the restore", tc.want)
		})
	}
}

// TestRestoreWithPreCheck (issue 20 case 2): the batch consumer's
// Middleware has a duplicate pre-check that remembers keys d-5 to d-9. The
// database is restored to an earlier point: offset row back at 5, claims and
// effects of records 5 to 9 gone. The consumer seeks to 5 and must apply
// 5 to 9 again: the pre-check's memory cannot answer for the database, and
// must never advance the stored offset on its own.
func TestRestoreWithPreCheck(t *testing.T) {
	t.Parallel()
	d := newDurable(t, "precheck", "precheck")
	seen, err := idempotent.NewSeenLRU(1000)
	if err != nil {
		t.Fatal(err)
	}
	mw := newMiddleware(t, d.db, d.s, d.consumer, idempotent.WithSeen(seen))
	d.send(ids("d", 0, 10)...)
	d.run(d.newConsumer(mw, true, nil), "precheck", "ten records applied", func() bool { return d.stored() == 10 })
	// The pre-check learns keys 5 to 9 as any redelivery through the
	// Middleware would teach it: they are duplicates.
	var msgs []idempotent.Message
	for _, id := range ids("d", 5, 10) {
		msgs = append(msgs, idempotent.Message{Key: id})
	}
	if _, err := mw.ProcessMessages(context.Background(), msgs, func(context.Context, *sql.Tx, []int) error {
		return errors.New("the claims exist: the handler must not run")
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.Exec(`UPDATE ` + d.s + `.kafka_offsets SET next_offset = 5`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.Exec(`DELETE FROM ` + d.s + `.processed_messages WHERE message_key IN ('d-5','d-6','d-7','d-8','d-9')`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.Exec(`DELETE FROM ` + d.s + `.ledger WHERE id IN ('d-5','d-6','d-7','d-8','d-9')`); err != nil {
		t.Fatal(err)
	}
	d.run(d.newConsumer(mw, true, nil), "precheck", "the offset back at 10", func() bool { return d.stored() == 10 })
	d.wantApplied("after the restore with the pre-check on", ids("d", 0, 10))
}

// TestStrictGuardThroughKafka (issue 20 case 5): the Middleware has
// WithStrictGuard, and the handler of k-0 sends "SELECT 1; COMMIT" — which
// commits the claim and the offset advance behind database/sql's back —
// and then fails. Through Process the strict guard reports exactly that
// (ErrAutocommit); the Kafka consumer must too, and must stop the partition
// rather than retry the record, find the offset moved and go on as if k-0
// had been applied.
func TestStrictGuardThroughKafka(t *testing.T) {
	t.Parallel()
	eachConsumer(t, func(t *testing.T, batch bool) {
		d := newDurable(t, "strict", "strict")
		mw := newMiddleware(t, d.db, d.s, d.consumer, idempotent.WithStrictGuard())
		obs := &recorder{}
		c := d.newConsumer(mw, batch, func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
			if string(r.Headers[0].Value) != "k-0" {
				return d.pay(ctx, tx, r)
			}
			if _, err := tx.ExecContext(ctx, "SELECT 1; COMMIT"); err != nil {
				return err
			}
			return errors.New("the effect failed")
		}, kafka.WithObserver(obs))
		d.send("k-0")
		var next sync.Once
		d.run(c, "strict", "the partition to stop, or the offset to move past k-0 and k-1", func() bool {
			if _, stopped := obs.first(adapter.EventStopped); stopped {
				return true
			}
			if d.stored() == 1 {
				next.Do(func() { d.send("k-1") })
			}
			return d.stored() == 2
		})
		e, ok := obs.first(adapter.EventStopped)
		if !ok {
			t.Fatalf("no EventStopped: the consumer went on past k-0 (stored offset %d, applied %v); events: %s", d.stored(), d.applied(), obs.summary())
		}
		if r := recordOf(e); !errors.Is(e.Err, idempotent.ErrAutocommit) || whereOf(t, e) != (where{d.topic, 0, 0}) || r == nil || r.Offset != 0 || e.Message.Key != "k-0" {
			t.Fatalf("EventStopped at %s (key %q) with %v, want k-0's, matching idempotent.ErrAutocommit", e.Source, e.Message.Key, e.Err)
		}
		if rel, ok := obs.first(adapter.EventReleased); !ok || rel.Message.Key != "k-0" || !errors.Is(rel.Err, idempotent.ErrAutocommit) {
			t.Fatalf("k-0 not reported released with its error: %+v; events: %s", rel, obs.summary())
		}
		if _, retried := obs.first(adapter.EventRequeued); retried {
			t.Errorf("k-0 was retried; events: %s", obs.summary())
		}
		d.wantApplied("after the handler's COMMIT", nil)
	})
}

// TestTxOptionsThroughKafka (issue 20 case 5): the Middleware's
// WithTxOptions applies to the Kafka consumer's transactions, as to
// Process's: each effect records the isolation level it ran at.
func TestTxOptionsThroughKafka(t *testing.T) {
	t.Parallel()
	eachConsumer(t, func(t *testing.T, batch bool) {
		d := newDurable(t, "txopts", "txopts")
		mw := newMiddleware(t, d.db, d.s, d.consumer, idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}))
		c := d.newConsumer(mw, batch, func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+d.s+`.ledger (id, account, amount, member) VALUES ($1, 'acct', 1, current_setting('transaction_isolation'))`, string(r.Headers[0].Value))
			return err
		})
		d.send(ids("t", 0, 3)...)
		d.run(c, "txopts", "three records applied", func() bool { return d.stored() == 3 })
		rows, err := d.db.Query(`SELECT id, member FROM ` + d.s + `.ledger ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var id, level string
			if err := rows.Scan(&id, &level); err != nil {
				t.Fatal(err)
			}
			n++
			if level != "serializable" {
				t.Errorf("%s applied at isolation level %q, want serializable (the Middleware's WithTxOptions)", id, level)
			}
		}
		if err := rows.Err(); err != nil || n != 3 {
			t.Fatalf("%d effects (%v), want 3", n, err)
		}
	})
}

// TestOffsetsSchemaNeverQueues: EnsureSchema of an offsets table that
// exists reads the catalog and sends no DDL, so a transaction holding the
// table exclusively does not hold it up; for a table that does not exist it
// bounds its lock waits and says so when it gives up, rather than queue.
func TestOffsetsSchemaNeverQueues(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4)
	s := schema(t, db) // creates s.kafka_offsets
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(`LOCK TABLE ` + s + `.kafka_offsets IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if err := kafka.EnsureSchema(ctx, db, s+".kafka_offsets"); err != nil {
		t.Errorf("EnsureSchema of an existing table behind an exclusive lock: %v", err)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}

	// Another process is creating the same missing table and holds the
	// lock that serialises the creators.
	missing := s + ".other_offsets"
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(hashtext($1))`, "idempotent/kafka:"+missing); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock_all()`) }()
	err = kafka.EnsureSchema(ctx, db, missing)
	if err == nil || !strings.Contains(err.Error(), "gave up after waiting") || ctx.Err() != nil {
		t.Fatalf("EnsureSchema behind another creator's lock: %v (context: %v), want it to give up at its lock timeout and say so", err, ctx.Err())
	}
	var exists bool
	if err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, missing).Scan(&exists); err != nil || exists {
		t.Fatalf("the table exists after EnsureSchema gave up (%v)", err)
	}
}
