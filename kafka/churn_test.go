package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/outbox"
)

type payment struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

const (
	churnPartitions = 6
	churnAccounts   = 60
	churnGroup      = "payments-group"
	churnConsumer   = "payments"
	churnTopic      = "payments"
	deadTopic       = "payments-dlq"
)

// workload is what the producer sent, for the audit.
type workload struct {
	mu       sync.Mutex
	unique   map[string]payment // applied-once ids
	sent     int
	dups     int
	poison   map[string]bool // "topic/partition/offset" of poison records
	end      map[int32]int64 // end offset of each partition
	balances map[string]int64
}

func partitionOf(account string) int32 {
	h := fnv.New32a()
	h.Write([]byte(account))
	return int32(h.Sum32() % churnPartitions)
}

// produce sends churnRecords records: about 30% re-send an earlier id (same
// key, same value, same partition), 2% are poison (no key header, or a
// value that is not JSON).
func produce(t testing.TB, cl *kgo.Client, w *workload, churnRecords int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(14, 2026))
	var ids []payment
	batch := make([]*kgo.Record, 0, 500)
	flush := func() {
		res := cl.ProduceSync(context.Background(), batch...)
		if err := res.FirstErr(); err != nil {
			t.Errorf("produce: %v", err)
			return
		}
		w.mu.Lock()
		for _, r := range res {
			rec := r.Record
			if rec.Offset+1 > w.end[rec.Partition] {
				w.end[rec.Partition] = rec.Offset + 1
			}
			if isPoison(rec) {
				w.poison[fmt.Sprintf("%s/%d/%d", rec.Topic, rec.Partition, rec.Offset)] = true
			}
		}
		w.mu.Unlock()
		batch = batch[:0]
	}
	for i := range churnRecords {
		var rec *kgo.Record
		switch {
		case i%100 == 50:
			acct := fmt.Sprintf("acct-%d", rng.IntN(churnAccounts))
			rec = &kgo.Record{Topic: churnTopic, Partition: partitionOf(acct), Value: []byte(`{"id":"nokey","account":"x","amount":1}`)}
		case i%100 == 99:
			acct := fmt.Sprintf("acct-%d", rng.IntN(churnAccounts))
			rec = &kgo.Record{Topic: churnTopic, Partition: partitionOf(acct), Value: []byte(`not json`),
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: fmt.Appendf(nil, "bad-%d", i)}}}
		default:
			var p payment
			if len(ids) > 0 && rng.Float64() < 0.3 {
				p = ids[rng.IntN(len(ids))]
				w.dups++
			} else {
				p = payment{ID: fmt.Sprintf("pay-%d", i), Account: fmt.Sprintf("acct-%d", rng.IntN(churnAccounts)), Amount: rng.Int64N(1000) + 1}
				ids = append(ids, p)
				w.mu.Lock()
				w.unique[p.ID] = p
				w.balances[p.Account] += p.Amount
				w.mu.Unlock()
			}
			v, _ := json.Marshal(p)
			rec = &kgo.Record{Topic: churnTopic, Partition: partitionOf(p.Account), Key: []byte(p.Account), Value: v,
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(p.ID)}}}
		}
		w.sent++
		batch = append(batch, rec)
		if len(batch) == cap(batch) {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}
}

func isPoison(r *kgo.Record) bool {
	return len(r.Headers) == 0 || string(r.Value) == "not json"
}

// applyPayment is the effect of one payment.
func applyPayment(ctx context.Context, tx *sql.Tx, s, member string, p payment) error {
	if _, err := tx.ExecContext(ctx, `UPDATE `+s+`.accounts SET balance = balance + $2 WHERE id = $1`, p.Account, p.Amount); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO `+s+`.ledger (id, account, amount, member) VALUES ($1, $2, $3, $4)`, p.ID, p.Account, p.Amount, member)
	return err
}

// applyPayments is the set-wise effect of a batch of payments.
func applyPayments(ctx context.Context, tx *sql.Tx, s, member string, rs []*kgo.Record) error {
	var ids, accts []string
	var amounts []int64
	for i, r := range rs {
		p, err := kafka.JSON[payment](r.Value)
		if err != nil {
			if r.Offset%10 == 0 {
				// A plain poison error: the consumer falls back to one
				// record at a time for this batch.
				return err
			}
			return adapter.PoisonItem(i, err)
		}
		ids, accts, amounts = append(ids, p.ID), append(accts, p.Account), append(amounts, p.Amount)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+s+`.ledger (id, account, amount, member)
SELECT id, account, amount, $4 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(id, account, amount)`,
		pq.Array(ids), pq.Array(accts), pq.Array(amounts), member); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `UPDATE `+s+`.accounts a SET balance = a.balance + d.total
FROM (SELECT account, sum(amount) AS total FROM unnest($1::text[], $2::bigint[]) AS u(account, amount) GROUP BY account ORDER BY account) d
WHERE a.id = d.account`, pq.Array(accts), pq.Array(amounts))
	return err
}

// TestChurn consumes 20,000 records (30% producer duplicates, 2% poison)
// with three group members while members crash and restart, a fourth joins
// and a partition's leader moves; then audits: every id applied once,
// balances exact, stored offsets at the partitions' end offsets, the
// dead-letter outbox holding exactly the poison records. Batch mode takes
// all 20,000; record mode, a transaction per record, the same workload
// scaled to 6,000 to keep the test's cost in CI reasonable, and record mode on
// a Middleware WithCoalescing the same. Under the race
// detector, which slows the in-process cluster several times, both take a
// third of that.
func TestChurn(t *testing.T) {
	scale := 1
	if raceDetector {
		scale = 3
	}
	for _, tc := range []struct {
		mode    string
		records int
	}{{"record", 6000 / scale}, {"record-coalesced", 6000 / scale}, {"batch", 20000 / scale}} {
		t.Run(tc.mode, func(t *testing.T) { testChurn(t, tc.mode, tc.records) })
	}
}

func testChurn(t *testing.T, mode string, churnRecords int) {
	// The durability of each commit is not what this test is about.
	db := openDB(t, 16, "synchronous_commit=off")
	s := schema(t, db)
	var mwOpts []idempotent.Option
	if mode == "record-coalesced" {
		// Each member's three workers coalesce their partitions' records.
		mwOpts = append(mwOpts, idempotent.WithCoalescing(idempotent.Coalescing{Max: 3, Wait: time.Millisecond}))
	}
	mw := newMiddleware(t, db, s, churnConsumer, mwOpts...)
	ob := newOutbox(t, db, s, churnConsumer)
	for i := range churnAccounts {
		if _, err := db.Exec(`INSERT INTO `+s+`.accounts (id) VALUES ($1)`, fmt.Sprintf("acct-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	cluster := newCluster(t, churnPartitions, churnTopic, deadTopic)
	clientOpts := []kgo.Opt{
		kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(churnGroup), kgo.ConsumeTopics(churnTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond), kgo.RebalanceTimeout(3 * time.Second),
	}

	var consumers []*kafka.Consumer
	var cmu sync.Mutex
	obs := &counter{}
	newConsumer := func(name string, crashy bool) *kafka.Consumer {
		opts := []kafka.Option{
			kafka.WithOffsetsTable(s + ".kafka_offsets"), kafka.WithDeadLetter(ob, deadTopic), kafka.WithObserver(obs),
			kafka.WithWorkers(3), kafka.WithRetryDelay(10*time.Millisecond, 200*time.Millisecond), kafka.WithMaxPollRecords(600),
		}
		if crashy {
			// A crash: transactions in flight are cancelled mid-way.
			opts = append(opts, kafka.WithShutdownTimeout(time.Millisecond))
		}
		var c *kafka.Consumer
		var err error
		if mode == "batch" {
			c, err = kafka.NewBatchConsumer(mw, func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error {
				return applyPayments(ctx, tx, s, name, rs)
			}, opts...)
		} else {
			c, err = kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
				return applyPayment(ctx, tx, s, name, p)
			}), opts...)
		}
		if err != nil {
			t.Fatal(err)
		}
		cmu.Lock()
		consumers = append(consumers, c)
		cmu.Unlock()
		return c
	}

	w := &workload{unique: map[string]payment{}, poison: map[string]bool{}, end: map[int32]int64{}, balances: map[string]int64{}}
	prod := producer(t, cluster)
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		t0 := time.Now()
		produce(t, prod, w, churnRecords)
		t.Logf("produced in %v", time.Since(t0).Round(time.Millisecond))
	}()

	members := make([]*member, 3)
	for i := range members {
		members[i] = startMember(newConsumer(fmt.Sprintf("m%d", i), true), fmt.Sprintf("m%d", i), clientOpts...)
	}
	progress := func() int64 {
		var n int64
		for _, o := range storedOffsets(t, db, s, churnConsumer, churnTopic) {
			n += o
		}
		return n
	}
	start := time.Now()
	reach := func(n int64) {
		defer func() { t.Logf("%v: %d consumed", time.Since(start).Round(time.Millisecond), n) }()
		waitFor(t, fmt.Sprintf("%d records consumed", n), func() (bool, error) { return progress() >= n, nil })
	}

	// Crash member 0 and restart it.
	reach(int64(churnRecords / 5))
	members[0].stop(t)
	members[0] = startMember(newConsumer("m0b", true), "m0b", clientOpts...)

	// Move a partition's leader.
	reach(int64(churnRecords * 2 / 5))
	if err := cluster.MoveTopicPartition(churnTopic, 2, (cluster.LeaderFor(churnTopic, 2)+1)%3); err != nil {
		t.Fatalf("move partition leader: %v", err)
	}

	// A fourth member joins mid-stream.
	reach(int64(churnRecords / 2))
	members = append(members, startMember(newConsumer("m3", false), "m3", clientOpts...))

	// Crash member 1 and restart it.
	reach(int64(churnRecords * 7 / 10))
	members[1].stop(t)
	members[1] = startMember(newConsumer("m1b", true), "m1b", clientOpts...)

	<-produced
	waitFor(t, "every partition consumed to its end", func() (bool, error) {
		got := storedOffsets(t, db, s, churnConsumer, churnTopic)
		for p := range int32(churnPartitions) {
			if got[p] != w.end[p] {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("%v: all consumed", time.Since(start).Round(time.Millisecond))
	for _, m := range members {
		m.stop(t)
	}
	t.Logf("%v: members stopped", time.Since(start).Round(time.Millisecond))
	for i, c := range consumers {
		if n := kafka.Applying(c); n != 0 {
			t.Errorf("consumer %d counts %d partitions applying after its Run returned, want 0", i, n)
		}
	}

	// The audit.
	var rows, distinct int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT id) FROM `+s+`.ledger`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != len(w.unique) || distinct != len(w.unique) {
		t.Errorf("ledger: %d rows, %d distinct ids; want %d each (every id applied once)", rows, distinct, len(w.unique))
	}
	balances := map[string]int64{}
	brows, err := db.Query(`SELECT id, balance FROM ` + s + `.accounts`)
	if err != nil {
		t.Fatal(err)
	}
	for brows.Next() {
		var id string
		var b int64
		if err := brows.Scan(&id, &b); err != nil {
			t.Fatal(err)
		}
		if b != 0 {
			balances[id] = b
		}
	}
	brows.Close()
	for a, want := range w.balances {
		if balances[a] != want {
			t.Errorf("account %s: balance %d, want %d", a, balances[a], want)
		}
	}
	if len(balances) != len(w.balances) {
		t.Errorf("%d accounts with a balance, want %d", len(balances), len(w.balances))
	}
	stored := storedOffsets(t, db, s, churnConsumer, churnTopic)
	for p := range int32(churnPartitions) {
		if stored[p] != w.end[p] {
			t.Errorf("partition %d: stored offset %d, end offset %d", p, stored[p], w.end[p])
		}
	}
	var dead []string
	drows, err := db.Query(`SELECT message_key FROM `+s+`.outbox WHERE kind = $1`, kafka.DeadLetterKind)
	if err != nil {
		t.Fatal(err)
	}
	for drows.Next() {
		var k string
		if err := drows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, k)
	}
	drows.Close()
	var want []string
	for k := range w.poison {
		want = append(want, k)
	}
	slices.Sort(dead)
	slices.Sort(want)
	if !slices.Equal(dead, want) {
		t.Errorf("dead-letter outbox holds %d rows, want exactly the %d poison records", len(dead), len(want))
	}
	var applied, dups, deadLettered int64
	cmu.Lock()
	for _, c := range consumers {
		st := c.Stats()
		applied += st.Applied
		dups += st.Duplicates
		deadLettered += st.DeadLettered
	}
	cmu.Unlock()
	if applied != int64(len(w.unique)) || deadLettered != int64(len(w.poison)) {
		t.Errorf("stats: %d applied, %d dead-lettered; want %d and %d", applied, deadLettered, len(w.unique), len(w.poison))
	}
	t.Logf("%s mode: %d records sent (%d producer duplicates, %d poison) to %d partitions; %d ids applied once, %d duplicates seen, %d dead-lettered; %d requeued, %d fenced, %d assignments, %d released",
		mode, w.sent, w.dups, len(w.poison), churnPartitions, applied, dups, deadLettered,
		obs.get(adapter.EventRequeued), obs.get(adapter.EventFenced), obs.get(adapter.EventAssigned), obs.get(adapter.EventReleased))
	_ = idempotent.Applied
	_ = outbox.DefaultTable
}
