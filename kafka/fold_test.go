package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
)

// foldTo folds mw's claim with a companion that credits an account — one
// row affected when the account exists, none otherwise, as the offset
// advance affects one row when it advances — and prepares it on db.
func foldTo(t *testing.T, db *sql.DB, mw *idempotent.Middleware, s string) (*adapter.Fold, *sql.Stmt) {
	t.Helper()
	f, ok := adapter.NewFold(mw, func(first int) string {
		return `UPDATE ` + s + `.accounts SET balance = balance + $` + strconv.Itoa(first) + ` WHERE id = $` + strconv.Itoa(first+1)
	})
	if !ok {
		t.Fatal("the Postgres dialect did not fold the claim")
	}
	stmt, err := db.Prepare(f.SQL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stmt.Close() })
	return f, stmt
}

// foldOnce runs the fold for key and at in a transaction of its own,
// crediting account, and commits when it did not fail.
func foldOnce(t *testing.T, db *sql.DB, f *adapter.Fold, stmt *sql.Stmt, key string, at time.Time, account string) (int64, bool, error) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// A bound, so that a claim that waits for ever (no lock timeout) fails
	// the test rather than hangs it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, claimed, err := f.Claim(ctx, tx, stmt, idempotent.Message{Key: key, EventTime: at}, 1, account)
	if err != nil {
		return n, claimed, err
	}
	return n, claimed, tx.Commit()
}

// TestFoldKeepsClaimSemantics runs the claim folded with a companion
// statement (what the Consumer does with its offset advance) through each
// thing the Middleware's claim does: new and existing claims with the
// companion's own row count, the key and event-time checks, the event day
// of partitioned mode and its missing partition, the lock timeout, and a
// missing claim table.
func TestFoldKeepsClaimSemantics(t *testing.T) {
	t.Parallel()
	db := openDB(t, 4)
	s := schema(t, db)
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	clock := idempotent.WithClock(func() time.Time { return now })
	balance := func() int64 {
		var b int64
		if err := db.QueryRow(`SELECT balance FROM ` + s + `.accounts WHERE id = 'acct'`).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	expect := func(what string, n int64, claimed bool, err error, wantN int64, wantClaimed bool) {
		t.Helper()
		if err != nil || n != wantN || claimed != wantClaimed {
			t.Fatalf("%s: fold = (%d, %v, %v), want (%d, %v, nil)", what, n, claimed, err, wantN, wantClaimed)
		}
	}
	expectErr := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("%s: fold error %v, want one matching %v", what, err, want)
		}
	}

	t.Run("plain", func(t *testing.T) {
		mw := newMiddleware(t, db, s, "fold-plain")
		f, stmt := foldTo(t, db, mw, s)
		n, claimed, err := foldOnce(t, db, f, stmt, "k-1", time.Time{}, "acct")
		expect("a new claim", n, claimed, err, 1, true)
		n, claimed, err = foldOnce(t, db, f, stmt, "k-1", time.Time{}, "acct")
		expect("the same key again", n, claimed, err, 1, false)
		n, claimed, err = foldOnce(t, db, f, stmt, "k-2", time.Time{}, "nobody")
		expect("a companion that affects nothing", n, claimed, err, 0, true)
		if b := balance(); b != 2 {
			t.Fatalf("balance %d after two folds that credited the account, want 2", b)
		}
		var claims int
		if err := db.QueryRow(`SELECT count(*) FROM `+s+`.processed_messages WHERE consumer = $1`, "fold-plain").Scan(&claims); err != nil {
			t.Fatal(err)
		}
		if claims != 2 {
			t.Fatalf("%d claims, want 2 (k-1 and k-2)", claims)
		}
		_, _, err = foldOnce(t, db, f, stmt, "", time.Time{}, "acct")
		expectErr("an empty key", err, idempotent.ErrInvalidKey)
	})

	t.Run("event times and partitions", func(t *testing.T) {
		mw, err := idempotent.New(db, postgres.New(), "fold-parted", idempotent.WithTable(s+".parted"), idempotent.WithDailyPartitions(2), clock)
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.EnsureSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
		f, stmt := foldTo(t, db, mw, s)
		n, claimed, err := foldOnce(t, db, f, stmt, "p-1", now.Add(-36*time.Hour), "acct")
		expect("a claim in partitioned mode", n, claimed, err, 1, true)
		var day time.Time
		if err := db.QueryRow(`SELECT event_day FROM ` + s + `.parted WHERE message_key = 'p-1'`).Scan(&day); err != nil {
			t.Fatal(err)
		}
		if got := day.Format(time.DateOnly); got != "2031-03-13" {
			t.Fatalf("the claim's event day is %s, want 2031-03-13", got)
		}
		_, _, err = foldOnce(t, db, f, stmt, "p-2", time.Time{}, "acct")
		expectErr("no event time in partitioned mode", err, idempotent.ErrInvalidEventTime)
		_, _, err = foldOnce(t, db, f, stmt, "p-3", now.Add(-60*24*time.Hour), "acct")
		expectErr("an event time beyond the retention window", err, idempotent.ErrBeyondRetention)
		_, _, err = foldOnce(t, db, f, stmt, "p-4", now.Add(time.Hour), "acct")
		expectErr("an event time in the future", err, idempotent.ErrInvalidEventTime)
		if _, err := db.Exec(`DROP TABLE ` + s + `.parted_p20310312`); err != nil {
			t.Fatal(err)
		}
		_, _, err = foldOnce(t, db, f, stmt, "p-5", now.Add(-48*time.Hour), "acct")
		expectErr("a day without its partition", err, idempotent.ErrNoPartition)
	})

	t.Run("lock timeout", func(t *testing.T) {
		mw, err := idempotent.New(db, postgres.New(), "fold-busy", idempotent.WithTable(s+".processed_messages"), idempotent.WithLockTimeout(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		f, stmt := foldTo(t, db, mw, s)
		holder, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = holder.Rollback() }()
		if claimed, err := mw.ClaimMessage(context.Background(), holder, idempotent.Message{Key: "busy"}); err != nil || !claimed {
			t.Fatalf("holder's Claim = (%v, %v)", claimed, err)
		}
		_, _, err = foldOnce(t, db, f, stmt, "busy", time.Time{}, "acct")
		expectErr("a claim held by another transaction", err, idempotent.ErrClaimBusy)
	})

	t.Run("missing claim table", func(t *testing.T) {
		mw, err := idempotent.New(db, postgres.New(), "fold-gone", idempotent.WithTable(s+".gone"))
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.EnsureSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
		f, stmt := foldTo(t, db, mw, s)
		if _, err := db.Exec(`DROP TABLE ` + s + `.gone`); err != nil {
			t.Fatal(err)
		}
		_, _, err = foldOnce(t, db, f, stmt, "g-1", time.Time{}, "acct")
		expectErr("a claim table dropped after the fold was prepared", err, idempotent.ErrNoClaimTable)
	})
}

// errorsSeen is a counter that also keeps the errors of requeue events.
type errorsSeen struct {
	counter
	mu   sync.Mutex
	errs []error
}

func (o *errorsSeen) Observe(ctx context.Context, e adapter.Event) {
	o.counter.Observe(ctx, e)
	if e.Type == adapter.EventRequeued {
		o.mu.Lock()
		o.errs = append(o.errs, e.Err)
		o.mu.Unlock()
	}
}

// matching returns the requeue errors seen so far that match target; all of
// them when target is nil.
func (o *errorsSeen) matching(target error) []error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var matched []error
	for _, err := range o.errs {
		if target == nil || errors.Is(err, target) {
			matched = append(matched, err)
		}
	}
	return matched
}

// applied returns how many records were applied.
func (o *errorsSeen) applied() int { return o.get(adapter.EventApplied) }

// TestConsumerNamesTheMissingTable drops the offsets table, then the claim
// table, under a running Consumer whose claim and offset advance are one
// statement, and checks that each failure names the table that is missing.
func TestConsumerNamesTheMissingTable(t *testing.T) {
	t.Parallel()
	db := openDB(t, 8)
	s := schema(t, db)
	mw := newMiddleware(t, db, s, "missing")
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	const topic = "missing"
	cluster := newCluster(t, 1, topic)
	prod := producer(t, cluster)
	produce := func(id string) {
		t.Helper()
		v, _ := json.Marshal(payment{ID: id, Account: "acct", Amount: 1})
		rec := &kgo.Record{Topic: topic, Value: v, Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}}
		if err := prod.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	obs := &errorsSeen{}
	c, err := kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
		return applyPayment(ctx, tx, s, "missing", p)
	}), kafka.WithOffsetsTable(s+".kafka_offsets"), kafka.WithObserver(obs), kafka.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	produce("m-0")
	m := startMember(c, "missing", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("missing"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	defer m.stop(t)
	waitFor(t, "the first record applied", func() (bool, error) {
		return obs.applied() == 1, nil
	})

	if _, err := db.Exec(`DROP TABLE ` + s + `.kafka_offsets`); err != nil {
		t.Fatal(err)
	}
	produce("m-1")
	waitFor(t, "a retry", func() (bool, error) {
		return len(obs.matching(nil)) > 0, nil
	})
	for _, err := range obs.matching(nil) {
		if !errors.Is(err, kafka.ErrNoOffsetsTable) || errors.Is(err, idempotent.ErrNoClaimTable) {
			t.Fatalf("with the offsets table dropped, a retry's error is %v, want one matching kafka.ErrNoOffsetsTable and not idempotent.ErrNoClaimTable", err)
		}
	}

	// The offsets table back, the claim table gone.
	if _, err := db.Exec(`DROP TABLE ` + s + `.processed_messages`); err != nil {
		t.Fatal(err)
	}
	if err := kafka.EnsureSchema(context.Background(), db, s+".kafka_offsets"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a retry naming the claim table", func() (bool, error) {
		return len(obs.matching(idempotent.ErrNoClaimTable)) > 0, nil
	})
	for _, err := range obs.matching(idempotent.ErrNoClaimTable) {
		if errors.Is(err, kafka.ErrNoOffsetsTable) {
			t.Fatalf("with the claim table dropped, a retry blamed the offsets table: %v", err)
		}
	}
}
