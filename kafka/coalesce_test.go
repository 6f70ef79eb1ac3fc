package kafka_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
)

// The tests of this file run the per-record consumer (NewConsumer) on a
// Middleware created WithCoalescing: the records of different partitions in
// flight at the same time share one transaction, and the offsets of every
// record of the group are advanced in it.

// coFixture is a coalescing test's schema, a one-broker cluster (so that a
// poll holds every partition's records) with a topic of parts partitions,
// and a producer.
type coFixture struct {
	t      *testing.T
	db     *sql.DB
	s      string
	topic  string
	prod   *kgo.Client
	client []kgo.Opt
	events *recorder
}

func newCoFixture(t *testing.T, parts int32) *coFixture {
	t.Helper()
	db := openDB(t, 8)
	s := schema(t, db)
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct');
CREATE TABLE ` + s + `.txlog (seq bigserial, id text NOT NULL, topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL, txid bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const topic = "co"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return &coFixture{t: t, db: db, s: s, topic: topic, prod: producer(t, cluster), events: &recorder{},
		client: []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(testenv.UniqueName("co")), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond)}}
}

// produce sends the payments ids[p][i] to partition p, in order, and
// returns each partition's end offset.
func (f *coFixture) produce(ids [][]string) map[int32]int64 {
	f.t.Helper()
	ends := map[int32]int64{}
	for p, list := range ids {
		for _, id := range list {
			r := paymentRecord(f.topic, id)
			r.Partition = int32(p)
			if err := f.prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
				f.t.Fatal(err)
			}
			ends[int32(p)] = r.Offset + 1
		}
	}
	return ends
}

// handler logs each record it applies with its transaction's id, then
// applies its payment; before that, fail (when not nil) may fail it.
func (f *coFixture) handler(fail func(ctx context.Context, tx *sql.Tx, r *kgo.Record, p payment) error) kafka.Handler {
	return kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, r *kgo.Record) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+f.s+`.txlog (id, topic, partition, "offset", txid) VALUES ($1, $2, $3, $4, txid_current())`,
			p.ID, r.Topic, r.Partition, r.Offset); err != nil {
			return err
		}
		if fail != nil {
			if err := fail(ctx, tx, r, p); err != nil {
				return err
			}
		}
		return applyPayment(ctx, tx, f.s, "m", p)
	})
}

// consume runs a NewConsumer of mw with h until the stored offsets are
// ends.
func (f *coFixture) consume(mw *idempotent.Middleware, h kafka.Handler, ends map[int32]int64, opts ...kafka.Option) {
	f.t.Helper()
	c, err := kafka.NewConsumer(mw, h, append([]kafka.Option{kafka.WithOffsetsTable(f.s + ".kafka_offsets"), kafka.WithObserver(f.events),
		kafka.WithWorkers(len(ends)), kafka.WithRetryDelay(time.Millisecond, 5*time.Millisecond)}, opts...)...)
	if err != nil {
		f.t.Fatal(err)
	}
	m := startMember(c, "m", f.client...)
	waitFor(f.t, "every partition's stored offset at its end", func() (bool, error) {
		got := storedOffsets(f.t, f.db, f.s, mw.Config().Consumer, f.topic)
		for p, end := range ends {
			if got[p] != end {
				return false, nil
			}
		}
		return true, nil
	})
	m.stop(f.t)
	if n := kafka.Applying(c); n != 0 {
		f.t.Errorf("the consumer counts %d partitions applying after its Run returned, want 0", n)
	}
	if got := storedOffsets(f.t, f.db, f.s, mw.Config().Consumer, f.topic); len(got) != len(ends) {
		f.t.Errorf("stored offsets %v, want %v", got, ends)
	}
}

// wantLedger checks that the ledger holds exactly the payments want, once
// each, and that the balance is their sum.
func (f *coFixture) wantLedger(want []string) {
	f.t.Helper()
	wantAppliedOnce(f.t, f.db, f.s, "ledger", want)
	var balance int
	if err := f.db.QueryRow(`SELECT balance FROM ` + f.s + `.accounts WHERE id = 'acct'`).Scan(&balance); err != nil || balance != len(want) {
		f.t.Errorf("balance %d (%v), want %d", balance, err, len(want))
	}
}

// grid is parts partitions of per payments each, "prefix<p>-<i>", with
// edit(p, i, id) choosing each one's id and whether it is to be applied
// (edit may be nil: every one, as named). It returns the ids by
// partition, for produce, and those to apply.
func grid(prefix string, parts, per int, edit func(p, i int, id string) (string, bool)) (ids [][]string, want []string) {
	for p := range parts {
		var list []string
		for i := range per {
			id, keep := fmt.Sprintf("%s%d-%d", prefix, p, i), true
			if edit != nil {
				id, keep = edit(p, i, id)
			}
			list = append(list, id)
			if keep {
				want = append(want, id)
			}
		}
		ids = append(ids, list)
	}
	return ids, want
}

// groups returns, per transaction that applied records, the partitions of
// its records.
func (f *coFixture) groups() map[int64][]int32 {
	f.t.Helper()
	rows, err := f.db.Query(`SELECT txid, partition FROM ` + f.s + `.txlog ORDER BY txid, partition`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64][]int32{}
	for rows.Next() {
		var tx int64
		var p int32
		if err := rows.Scan(&tx, &p); err != nil {
			f.t.Fatal(err)
		}
		out[tx] = append(out[tx], p)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// wantCoalesced checks that some transaction applied records of two
// partitions or more, and that none applied two records of one partition.
func (f *coFixture) wantCoalesced() {
	f.t.Helper()
	shared := 0
	for tx, ps := range f.groups() {
		if len(slices.Compact(slices.Clone(ps))) != len(ps) {
			f.t.Errorf("transaction %d applied several records of one partition: %v", tx, ps)
		}
		if len(ps) > 1 {
			shared++
		}
	}
	if shared == 0 {
		f.t.Errorf("no transaction applied records of more than one partition: %v", f.groups())
	}
}

// wantOrder checks that each partition's records were applied in offset
// order.
func (f *coFixture) wantOrder() {
	f.t.Helper()
	rows, err := f.db.Query(`SELECT partition, "offset" FROM ` + f.s + `.txlog ORDER BY seq`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	last := map[int32]int64{}
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			f.t.Fatal(err)
		}
		if prev, ok := last[p]; ok && o <= prev {
			f.t.Errorf("partition %d: offset %d applied after %d", p, o, prev)
		}
		last[p] = o
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
}

func coalescing(max int, savepoints bool) idempotent.Option {
	return idempotent.WithCoalescing(idempotent.Coalescing{Max: max, Wait: 200 * time.Millisecond, Savepoints: savepoints})
}

// eachDesign runs f with the optimistic design and with savepoints.
func eachDesign(t *testing.T, f func(t *testing.T, savepoints bool)) {
	t.Parallel()
	for _, sp := range []bool{false, true} {
		t.Run(map[bool]string{false: "optimistic", true: "savepoints"}[sp], func(t *testing.T) {
			t.Parallel()
			f(t, sp)
		})
	}
}

// TestCoalescedRecordsShareTransactions: 4 partitions of 6 records each,
// producer duplicates among them, consumed by 4 workers coalescing up to 4:
// records of different partitions share transactions (their handlers read
// the same txid_current()), no transaction holds two records of one
// partition, each partition's records apply in offset order, every payment
// applies once, and each partition's offsets row was last written by the
// transaction of its last record — the group's.
func TestCoalescedRecordsShareTransactions(t *testing.T) {
	eachDesign(t, func(t *testing.T, savepoints bool) {
		f := newCoFixture(t, 4)
		mw := newMiddleware(t, f.db, f.s, "co", coalescing(4, savepoints))
		ids, want := grid("p", 4, 6, func(p, i int, id string) (string, bool) {
			if i == 3 {
				return fmt.Sprintf("p%d-1", p), false // a producer duplicate
			}
			return id, true
		})
		ends := f.produce(ids)
		f.consume(mw, f.handler(nil), ends)
		f.wantLedger(want)
		f.wantCoalesced()
		f.wantOrder()
		if n := len(f.events.of(adapter.EventDuplicate)); n != 4 {
			t.Errorf("%d duplicates, want 4", n)
		}
		// The last record of each partition was applied: its transaction
		// wrote the partition's offsets row (xmin, the 32 low bits of the
		// txid).
		rows, err := f.db.Query(`SELECT o.partition FROM ` + f.s + `.kafka_offsets o
JOIN ` + f.s + `.txlog l ON l.partition = o.partition AND l."offset" = o.next_offset - 1
WHERE o.xmin::text::bigint <> l.txid % 4294967296`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var p int32
			_ = rows.Scan(&p)
			t.Errorf("partition %d: the offsets row was not written by its last record's transaction", p)
		}
	})
}

// errFlaky is a handler's failure that is not poison: the record is
// retried in place.
var errFlaky = errors.New("flaky handler")

// TestCoalescedHandlerFailsAlone: in groups of 4 partitions' records, one
// handler fails once (retried in place) and another's record is poison
// (dead-lettered): only those records fail; the rest of their groups
// commit; the retried record's partition did not advance past it before
// its retry (its handler reads the stored offset then); every other payment
// applies exactly once and the offsets end exact.
func TestCoalescedHandlerFailsAlone(t *testing.T) {
	eachDesign(t, func(t *testing.T, savepoints bool) {
		f := newCoFixture(t, 4)
		mw := newMiddleware(t, f.db, f.s, "co", coalescing(4, savepoints))
		ids, want := grid("p", 4, 4, func(_, _ int, id string) (string, bool) { return id, id != "p2-2" })
		ends := f.produce(ids)
		var flaked atomic.Int32
		var mu sync.Mutex
		var problems []string
		fail := func(ctx context.Context, tx *sql.Tx, r *kgo.Record, p payment) error {
			switch p.ID {
			case "p1-1":
				if flaked.Add(1) == 1 {
					return errFlaky
				}
				var stored int64
				if err := tx.QueryRowContext(ctx, `SELECT next_offset FROM `+f.s+`.kafka_offsets WHERE consumer = 'co' AND partition = 1`).Scan(&stored); err != nil {
					return err
				}
				if stored != r.Offset {
					mu.Lock()
					problems = append(problems, fmt.Sprintf("p1-1 retried with the stored offset at %d, want %d (its own)", stored, r.Offset))
					mu.Unlock()
				}
			case "p2-2":
				return adapter.Poison(errors.New("a poison payment"))
			}
			return nil
		}
		f.consume(mw, f.handler(fail), ends)
		f.wantLedger(want)
		f.wantCoalesced()
		f.wantOrder()
		for _, p := range problems {
			t.Error(p)
		}
		requeued := f.events.of(adapter.EventRequeued)
		if len(requeued) != 1 || requeued[0].Message.Key != "p1-1" || !errors.Is(requeued[0].Err, errFlaky) {
			t.Errorf("requeued %v, want p1-1 once, for its handler's error", keysOf(requeued))
		}
		dead := f.events.of(adapter.EventDeadLettered)
		if len(dead) != 1 || dead[0].Message.Key != "p2-2" {
			t.Errorf("dead-lettered %v, want p2-2", keysOf(dead))
		}
		if n := len(f.events.of(adapter.EventApplied)); n != len(want) {
			t.Errorf("%d applied events, want %d", n, len(want))
		}
	})
}

func keysOf(es []adapter.Event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Message.Key
	}
	return out
}

// TestCoalescedDuplicatesAdvanceOffsets: every record of 4 partitions is a
// duplicate (its key was claimed before): the groups run no handler, and
// still commit every record's offset advance — the 4 partitions' offsets
// rows written by shared transactions.
func TestCoalescedDuplicatesAdvanceOffsets(t *testing.T) {
	eachDesign(t, func(t *testing.T, savepoints bool) {
		f := newCoFixture(t, 4)
		mw := newMiddleware(t, f.db, f.s, "co", coalescing(4, savepoints))
		ids, _ := grid("d", 4, 2, nil)
		ctx := context.Background()
		for _, list := range ids {
			for _, id := range list {
				if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: id}, func(context.Context, *sql.Tx) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}
		ends := f.produce(ids)
		f.consume(mw, f.handler(nil), ends)
		f.wantLedger(nil)
		if n := len(f.events.of(adapter.EventDuplicate)); n != 8 {
			t.Errorf("%d duplicates, want 8", n)
		}
		var writers, rows int
		if err := f.db.QueryRow(`SELECT count(DISTINCT xmin::text), count(*) FROM `+f.s+`.kafka_offsets`).Scan(&writers, &rows); err != nil {
			t.Fatal(err)
		}
		if rows != 4 || writers > 3 {
			t.Errorf("%d offsets rows last written by %d transactions, want 4 rows and some transaction writing several", rows, writers)
		}
	})
}

// TestCoalescedLostCommit cuts the answer to a group's COMMIT, which
// landed: the Middleware retries the group, whose claims are now
// duplicates and whose offsets have moved on (each record is then fenced
// and its partition read again from the stored offset); every payment
// applies exactly once and the offsets end exact.
func TestCoalescedLostCommit(t *testing.T) {
	t.Parallel()
	f := newCoFixture(t, 4)
	cut := &commitCutter{}
	pc, err := pq.NewConnector(testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err != nil {
		t.Fatal(err)
	}
	cut.inner = pc
	via := sql.OpenDB(cut)
	via.SetMaxOpenConns(8)
	t.Cleanup(func() { via.Close() })
	mw, err := idempotent.New(via, postgres.New(), "co", idempotent.WithTable(f.s+".processed_messages"), coalescing(4, false),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids, want := grid("l", 4, 3, nil)
	ends := f.produce(ids)
	var armed atomic.Bool
	arm := func(ctx context.Context, tx *sql.Tx, r *kgo.Record, p payment) error {
		if p.ID == "l2-1" && armed.CompareAndSwap(false, true) {
			_, err := tx.ExecContext(ctx, armCommitCut) // this transaction's COMMIT is cut
			return err
		}
		return nil
	}
	f.consume(mw, f.handler(arm), ends)
	if n := cut.cut.Load(); n != 1 {
		t.Fatalf("%d commits cut, want 1", n)
	}
	f.wantLedger(want)
	f.wantCoalesced()
	f.wantOrder()
	// The group whose COMMIT was cut held l2-1 and records of other
	// partitions: its retry found them all fenced.
	var group int
	if err := f.db.QueryRow(`SELECT count(*) FROM ` + f.s + `.txlog WHERE txid = (SELECT txid FROM ` + f.s + `.txlog WHERE id = 'l2-1')`).Scan(&group); err != nil || group < 2 {
		t.Errorf("the cut transaction applied %d records (%v), want several", group, err)
	}
	if n := len(f.events.of(adapter.EventFenced)); n != group {
		t.Errorf("%d fenced events, want %d (the retried group's records)", n, group)
	}
}

// armCommitCut, run in a transaction through commitCutter, makes the
// cutter report the transaction's COMMIT as failed (driver.ErrBadConn,
// the connection discarded) after the server committed it: a COMMIT whose
// answer was lost.
const armCommitCut = "SELECT 1 /* cut this transaction's commit */"

// commitCutter is a driver.Connector around lib/pq's that loses the answer
// to the COMMIT of a transaction that ran armCommitCut.
type commitCutter struct {
	inner driver.Connector
	cut   atomic.Int32
}

func (c *commitCutter) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: dc, c: c}, nil
}

func (c *commitCutter) Driver() driver.Driver { return c.inner.Driver() }

// cutConn is a connection of commitCutter; database/sql uses one from one
// goroutine at a time.
type cutConn struct {
	driver.Conn
	c     *commitCutter
	armed bool
	bad   bool
}

func (cc *cutConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := cc.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &cutTx{Tx: tx, cc: cc}, nil
}

func (cc *cutConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if q == armCommitCut {
		cc.armed = true
	}
	return cc.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (cc *cutConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return cc.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (cc *cutConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return cc.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (cc *cutConn) IsValid() bool { return !cc.bad }

func (cc *cutConn) ResetSession(ctx context.Context) error {
	if cc.bad {
		return driver.ErrBadConn
	}
	if r, ok := cc.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

type cutTx struct {
	driver.Tx
	cc *cutConn
}

func (t *cutTx) Commit() error {
	err := t.Tx.Commit()
	if t.cc.armed {
		t.cc.armed = false
		if err == nil {
			t.cc.bad = true
			t.cc.c.cut.Add(1)
			return driver.ErrBadConn
		}
	}
	return err
}

func (t *cutTx) Rollback() error {
	t.cc.armed = false
	return t.Tx.Rollback()
}

// TestCoalescedPartitionedStrict runs coalesced groups on a claim table
// partitioned by event day, with the strict guard and a lock timeout: each
// record's claim goes to its own event day's partition (records of two days
// share groups), a record older than the retention window is dropped alone
// before any group, the guard finds every handler in its group's
// transaction, and every other payment applies once.
func TestCoalescedPartitionedStrict(t *testing.T) {
	eachDesign(t, func(t *testing.T, savepoints bool) {
		f := newCoFixture(t, 4)
		mw := newMiddleware(t, f.db, f.s, "co", coalescing(4, savepoints), idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(2),
			idempotent.WithStrictGuard(), idempotent.WithLockTimeout(2*time.Second))
		now := time.Now()
		yesterday := now.Add(-24 * time.Hour)
		var want []string
		ends := map[int32]int64{}
		days := map[string]int{}
		for p := range int32(4) {
			for i := range 4 {
				id, at := fmt.Sprintf("e%d-%d", p, i), now.Add(-time.Minute)
				switch {
				case p == 3 && i == 2:
					id, at = "too-old", now.Add(-5*24*time.Hour)
				case (int(p)+i)%2 == 0:
					at = yesterday
				}
				if id != "too-old" {
					want = append(want, id)
					days[at.UTC().Format("20060102")]++
				}
				r := paymentRecord(f.topic, id, eventTimeHeader(at))
				r.Partition = p
				if err := f.prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
					t.Fatal(err)
				}
				ends[p] = r.Offset + 1
			}
		}
		f.consume(mw, f.handler(nil), ends)
		f.wantLedger(want)
		f.wantCoalesced()
		f.wantOrder()
		for day, n := range days {
			var got int
			if err := f.db.QueryRow(`SELECT count(*) FROM ` + f.s + `.processed_messages_p` + day).Scan(&got); err != nil || got != n {
				t.Errorf("partition of %s holds %d claims (%v), want %d", day, got, err, n)
			}
		}
		dead := f.events.of(adapter.EventDeadLettered)
		if len(dead) != 1 || dead[0].Message.Key != "too-old" || !errors.Is(dead[0].Err, idempotent.ErrBeyondRetention) {
			t.Errorf("dead-lettered %v, want too-old, beyond retention", keysOf(dead))
		}
		if e, ok := f.events.first(adapter.EventStopped); ok {
			t.Errorf("a partition stopped: %v", e.Err)
		}
	})
}

// TestCoalescedLonePartitionDoesNotWait: with one partition to apply, no
// other record can join a record's group, so its group closes at once
// instead of waiting out Wait (a second here) for each of 5 records.
func TestCoalescedLonePartitionDoesNotWait(t *testing.T) {
	t.Parallel()
	f := newCoFixture(t, 1)
	mw := newMiddleware(t, f.db, f.s, "co", idempotent.WithCoalescing(idempotent.Coalescing{Max: 4, Wait: time.Second}))
	ids, want := grid("w", 1, 5, nil)
	ends := f.produce(ids)
	start := time.Now()
	f.consume(mw, f.handler(nil), ends, kafka.WithWorkers(4))
	if d := time.Since(start); d >= 5*time.Second {
		t.Errorf("5 records of one partition took %v: each waited out Wait", d)
	}
	f.wantLedger(want)
}

// TestCoalescedStrictGuardStopsTheCulpritAlone: with WithStrictGuard, the
// handler of one record of a group sends "SELECT 1; COMMIT" — committing
// the group's transaction behind database/sql's back — and then fails: the
// guard reports it (idempotent.ErrAutocommit) for that record alone, whose
// partition stops instead of retrying it and finding it a duplicate, while
// the others of the group run again and are applied once each, their
// offsets advanced.
func TestCoalescedStrictGuardStopsTheCulpritAlone(t *testing.T) {
	eachDesign(t, func(t *testing.T, savepoints bool) {
		f := newCoFixture(t, 3)
		mw := newMiddleware(t, f.db, f.s, "co", coalescing(3, savepoints), idempotent.WithStrictGuard())
		ids, _ := grid("s", 3, 1, nil)
		f.produce(ids)
		c, err := kafka.NewConsumer(mw, f.handler(func(ctx context.Context, tx *sql.Tx, r *kgo.Record, p payment) error {
			if p.ID != "s1-0" {
				return nil
			}
			if _, err := tx.ExecContext(ctx, "SELECT 1; COMMIT"); err != nil {
				return err
			}
			return errors.New("the effect failed")
		}), kafka.WithOffsetsTable(f.s+".kafka_offsets"), kafka.WithObserver(f.events), kafka.WithWorkers(3))
		if err != nil {
			t.Fatal(err)
		}
		m := startMember(c, "m", f.client...)
		waitFor(t, "the culprit's partition to stop and the others to advance", func() (bool, error) {
			return len(f.events.of(adapter.EventStopped)) == 1 && len(storedOffsets(t, f.db, f.s, "co", f.topic)) == 2, nil
		})
		m.stop(t)
		for _, e := range f.events.of(adapter.EventStopped) {
			if !errors.Is(e.Err, idempotent.ErrAutocommit) || e.Message.Key != "s1-0" {
				t.Errorf("%s stopped on %q with %v, want s1-0's partition with idempotent.ErrAutocommit", e.Source, e.Message.Key, e.Err)
			}
		}
		if rq := f.events.of(adapter.EventRequeued); len(rq) > 0 {
			t.Errorf("requeued %v: a record of the group was retried", keysOf(rq))
		}
		if got := storedOffsets(t, f.db, f.s, "co", f.topic); len(got) != 2 || got[0] != 1 || got[2] != 1 {
			t.Errorf("stored offsets %v, want partitions 0 and 2 past their record, 1 not advanced", got)
		}
		f.wantLedger([]string{"s0-0", "s2-0"})
	})
}

// retryObserver is an idempotent.Observer that hands each retry to retry.
type retryObserver struct{ retry func(idempotent.RetryEvent) }

func (retryObserver) Outcome(context.Context, idempotent.Event) {}

func (o retryObserver) Retry(_ context.Context, e idempotent.RetryEvent) { o.retry(e) }

// TestCoalescedLockWaitRunsAlone: a record whose handler waits for a row
// lock longer than the group's Coalescing.LockWait (50 ms by default)
// leaves its group, which commits without it, and runs alone, in its own
// transaction with its own offset advance, once the lock is free.
//
// Which records share a group is the consumer's choice (a poll may hand it
// partition 1's record after the others' group closed): the scenario runs
// again, on a fresh topic, until partition 1's record was fetched with the
// others, for a record alone waits for the lock with no bound.
func TestCoalescedLockWaitRunsAlone(t *testing.T) {
	eachDesign(t, func(t *testing.T, savepoints bool) {
		const attempts = 5
		for i := 1; ; i++ {
			if lockWaitRunsAlone(t, savepoints) {
				return
			}
			if i == attempts {
				t.Fatalf("partition 1's record ran alone, outside any group, in each of %d tries", attempts)
			}
			t.Logf("try %d: partition 1's record was fetched apart from the others; once more", i)
		}
	})
}

// lockWaitRunsAlone is one try of TestCoalescedLockWaitRunsAlone. It
// reports false, having checked nothing but the ledger, when h1-0's handler
// found itself outside a group (no lock wait bound set): it then frees the
// lock before it waits on it.
func lockWaitRunsAlone(t *testing.T, savepoints bool) bool {
	f := newCoFixture(t, 3)
	if _, err := f.db.Exec(`INSERT INTO ` + f.s + `.accounts (id) VALUES ('hot')`); err != nil {
		t.Fatal(err)
	}
	holder, err := f.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() //nolint:errcheck
	if _, err := holder.Exec(`SELECT 1 FROM ` + f.s + `.accounts WHERE id = 'hot' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	released := make(chan struct{})
	var once sync.Once
	free := func() {
		once.Do(func() {
			close(release)
			<-released
		})
	}
	var reasons []string
	var mu sync.Mutex
	var ungrouped atomic.Bool
	mw := newMiddleware(t, f.db, f.s, "co", coalescing(3, savepoints), idempotent.WithObserver(retryObserver{retry: func(e idempotent.RetryEvent) {
		mu.Lock()
		reasons = append(reasons, e.Key+":"+e.Reason)
		mu.Unlock()
		if e.Key == "h1-0" && e.Reason == "lock_timeout" {
			go free()
		}
	}}))
	go func() {
		<-release
		_ = holder.Commit()
		close(released)
	}()
	ids, want := grid("h", 3, 1, nil)
	ends := f.produce(ids)
	f.consume(mw, f.handler(func(ctx context.Context, tx *sql.Tx, r *kgo.Record, p payment) error {
		if p.ID != "h1-0" {
			return nil
		}
		var bound string
		if err := tx.QueryRowContext(ctx, `SELECT current_setting('lock_timeout')`).Scan(&bound); err != nil {
			return err
		}
		if bound == "0" && !ungrouped.Load() {
			// Alone before it ever waited in a group: it would wait
			// for the holder forever.
			ungrouped.Store(true)
			free()
		}
		_, err := tx.ExecContext(ctx, `UPDATE `+f.s+`.accounts SET balance = balance WHERE id = 'hot'`)
		return err
	}), ends)
	f.wantLedger(want)
	mu.Lock()
	defer mu.Unlock()
	if ungrouped.Load() && !slices.Contains(reasons, "h1-0:lock_timeout") {
		return false
	}
	if !slices.Contains(reasons, "h1-0:lock_timeout") {
		t.Errorf("retries %v, want h1-0's lock_timeout", reasons)
	}
	// Its group was partitions 0, 1 and 2, or (a poll handing partition
	// 2's record over late) 0 and 1: partition 1 alone either way.
	groups := f.groups()
	var alone int
	for _, ps := range groups {
		if slices.Contains(ps, 1) {
			if len(ps) != 1 {
				t.Errorf("transactions %v: partition 1 shared one, want it alone", groups)
			}
			alone++
		}
	}
	if alone != 1 || len(groups) < 2 || len(groups) > 3 {
		t.Errorf("transactions %v, want partition 1 alone in one, and 0 and 2 in one or two others", groups)
	}
	return true
}
