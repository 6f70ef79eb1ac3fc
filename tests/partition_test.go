package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// partDay returns midnight UTC of the given date.
func partDay(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }

// partNames returns the names of ps.
func partNames(ps []idempotent.Partition) []string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s:%v", p.Name, p.Attached))
	}
	return out
}

// dayNames returns processed_messages_pYYYYMMDD:true for every day from
// first to last.
func dayNames(first, last time.Time) []string {
	var out []string
	for d := first; !d.After(last); d = d.AddDate(0, 0, 1) {
		out = append(out, "processed_messages_p"+d.Format("20060102")+":true")
	}
	return out
}

// partitionedLoyalty is the loyalty service on a partitioned claim table,
// with a clock at now.
func partitionedLoyalty(t *testing.T, now time.Time, lead int) (*loyalty, *testenv.Clock) {
	t.Helper()
	clock := testenv.NewClock(now)
	return newLoyalty(t, openDB(t), idempotent.WithDailyPartitions(lead), idempotent.WithClock(clock.Now)), clock
}

// partitionOf returns the partition holding the claim for key.
func partitionOf(t testing.TB, l *loyalty, key string) string {
	t.Helper()
	var name string
	err := l.db.QueryRow("SELECT tableoid::regclass::text FROM "+pq.QuoteIdentifier(l.schema)+".processed_messages WHERE message_key = $1", key).Scan(&name)
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return name
}

func TestPartitionedSchema(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	l, _ := partitionedLoyalty(t, now, 3)
	ctx := context.Background()
	table := pq.QuoteIdentifier(l.schema) + ".processed_messages"
	var key, partKey string
	var defaults int
	err := l.db.QueryRow(`
SELECT (SELECT string_agg(a.attname, ',' ORDER BY k.ord)
          FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
         WHERE i.indrelid = $1::regclass AND i.indisprimary),
       pg_get_partkeydef($1::regclass),
       (SELECT count(*) FROM pg_partitioned_table WHERE partrelid = $1::regclass AND partdefid <> 0)`, table).Scan(&key, &partKey, &defaults)
	if err != nil {
		t.Fatal(err)
	}
	if key != "consumer,message_key,event_day" || partKey != "RANGE (event_day)" || defaults != 0 {
		t.Fatalf("primary key (%s), partition key %s, %d default partitions; want (consumer,message_key,event_day), RANGE (event_day), none", key, partKey, defaults)
	}

	// EnsureSchema made every day of the window (30 days + 5 minutes back
	// from noon on 14 March is 12 February) and 3 days ahead.
	ps, err := l.mw.ClaimTable().Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := partNames(ps), dayNames(partDay(2031, 2, 12), partDay(2031, 3, 17)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partitions\n%v\nwant\n%v", got, want)
	}
	// EnsureSchema again changes nothing; MaintainPartitions has nothing to do.
	if err := l.mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if rep, err := l.mw.ClaimTable().MaintainPartitions(ctx); err != nil || len(rep.Created)+len(rep.Dropped) != 0 {
		t.Fatalf("MaintainPartitions on a maintained table = (%+v, %v)", rep, err)
	}

	// A claim lands in its event day's partition.
	msg := orderCompleted{OrderID: 5, CustomerID: 5, TotalCents: 900}
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: time.Date(2031, 3, 10, 23, 30, 0, 0, time.FixedZone("UTC-2", -2*3600))}, func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, msg) }); got != idempotent.Applied || err != nil {
		t.Fatalf("ProcessMessage = (%v, %v)", got, err)
	}
	if got, want := partitionOf(t, l, msg.key()), l.schema+".processed_messages_p20310311"; got != want {
		t.Fatalf("claim in %s, want %s (the event's UTC day)", got, want)
	}
}

// TestPartitionTrapRedeliveryTheNextDay shows the trap of partitioning on
// the processing time and its fix.
func TestPartitionTrapRedeliveryTheNextDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}

	t.Run("naive table partitioned on processed_at applies twice", func(t *testing.T) {
		t.Parallel()
		l := newLoyalty(t, openDB(t))
		s := pq.QuoteIdentifier(l.schema)
		// The guide's table, partitioned by day of processed_at DEFAULT
		// now(): the primary key must then contain processed_at.
		if _, err := l.db.Exec(fmt.Sprintf(`
CREATE TABLE %[1]s.naive (
	consumer     text        NOT NULL,
	message_key  text        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_key, processed_at)
) PARTITION BY RANGE (processed_at);
CREATE TABLE %[1]s.naive_day1 PARTITION OF %[1]s.naive FOR VALUES FROM (MINVALUE) TO (MAXVALUE);
CREATE TABLE %[1]s.naive_horizon (consumer text PRIMARY KEY, forgotten_before timestamptz NOT NULL);`, s)); err != nil {
			t.Fatal(err)
		}
		naive, err := idempotent.New(l.db, postgres.New(), "loyalty", idempotent.WithTable(l.schema+".naive"))
		if err != nil {
			t.Fatal(err)
		}
		apply := func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, msg) }
		if got, err := naive.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, apply); got != idempotent.Applied || err != nil {
			t.Fatalf("first delivery = (%v, %v)", got, err)
		}
		// Midnight passes: day 1 ends just after the first claim's
		// processed_at and day 2 begins.
		var first time.Time
		if err := l.db.QueryRow("SELECT processed_at FROM " + s + ".naive").Scan(&first); err != nil {
			t.Fatal(err)
		}
		midnight := pq.QuoteLiteral(first.Add(time.Microsecond).Format(time.RFC3339Nano))
		if _, err := l.db.Exec(fmt.Sprintf(`
ALTER TABLE %[1]s.naive DETACH PARTITION %[1]s.naive_day1;
ALTER TABLE %[1]s.naive ATTACH PARTITION %[1]s.naive_day1 FOR VALUES FROM (MINVALUE) TO (%[2]s);
CREATE TABLE %[1]s.naive_day2 PARTITION OF %[1]s.naive FOR VALUES FROM (%[2]s) TO (MAXVALUE);`, s, midnight)); err != nil {
			t.Fatal(err)
		}
		got, err := naive.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, apply)
		if err != nil {
			t.Fatal(err)
		}
		if got != idempotent.Applied || l.balance(t, 7) != 100 || l.ledgerRows(t, 9912) != 2 {
			t.Fatalf("redelivery the next day = %v, balance %d, %d ledger rows: the naive table was expected to apply it twice",
				got, l.balance(t, 7), l.ledgerRows(t, 9912))
		}
	})

	t.Run("event-day partitions find the claim", func(t *testing.T) {
		t.Parallel()
		eventTime := time.Date(2031, 3, 14, 23, 59, 0, 0, time.UTC)
		l, clock := partitionedLoyalty(t, eventTime.Add(30*time.Second), 2)
		apply := func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, msg) }
		if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: eventTime}, apply); got != idempotent.Applied || err != nil {
			t.Fatalf("first delivery = (%v, %v)", got, err)
		}
		clock.Set(time.Date(2031, 3, 15, 0, 0, 30, 0, time.UTC)) // the next day
		if _, err := l.mw.ClaimTable().MaintainPartitions(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key(), EventTime: eventTime}, apply)
		if got != idempotent.Duplicate || err != nil {
			t.Fatalf("redelivery the next day = (%v, %v), want Duplicate", got, err)
		}
		if l.balance(t, 7) != 50 || l.ledgerRows(t, 9912) != 1 {
			t.Fatalf("balance %d, %d ledger rows; want 50 and 1", l.balance(t, 7), l.ledgerRows(t, 9912))
		}
		if p := partitionOf(t, l, msg.key()); p != l.schema+".processed_messages_p20310314" {
			t.Fatalf("claim in %s", p)
		}
	})
}

func TestMaintainPartitionsCreatesAheadAndDropsOldDays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock := partitionedLoyalty(t, time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC), 3)
	nop := func(context.Context, *sql.Tx) error { return nil }
	for key, at := range map[string]time.Time{
		"oldest": time.Date(2031, 2, 12, 13, 0, 0, 0, time.UTC),
		"middle": time.Date(2031, 3, 1, 8, 0, 0, 0, time.UTC),
	} {
		if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, nop); got != idempotent.Applied || err != nil {
			t.Fatalf("%s: (%v, %v)", key, got, err)
		}
	}

	clock.Add(5 * 24 * time.Hour) // noon on 19 March
	rep, err := l.mw.ClaimTable().MaintainPartitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := partNames(rep.Created), dayNames(partDay(2031, 3, 18), partDay(2031, 3, 22)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("created %v, want %v", got, want)
	}
	if got, want := partNames(rep.Dropped), dayNames(partDay(2031, 2, 12), partDay(2031, 2, 16)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dropped %v, want %v", got, want)
	}
	ps, err := l.mw.ClaimTable().Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := partNames(ps), dayNames(partDay(2031, 2, 17), partDay(2031, 3, 22)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partitions %v\nwant %v", got, want)
	}
	var leftovers int
	if err := l.db.QueryRow("SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE 'processed_messages_p202102%'", l.schema).Scan(&leftovers); err != nil {
		t.Fatal(err)
	}
	if leftovers != 0 {
		t.Fatalf("%d dropped days still exist as tables", leftovers)
	}
	table := l.schema + ".processed_messages"
	if n := retCount(t, l.db, table, ""); n != 1 || partitionOf(t, l, "middle") != table+"_p20310301" {
		t.Fatalf("%d claims left, want only the one of 1 March", n)
	}
	// The fence and the drop agree: the oldest day kept still takes
	// messages, older ones are refused before they reach the database.
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "edge", EventTime: time.Date(2031, 2, 17, 12, 0, 1, 0, time.UTC)}, nop); got != idempotent.Applied || err != nil {
		t.Fatalf("event inside the window on the oldest day kept = (%v, %v)", got, err)
	}
	if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "oldest", EventTime: time.Date(2031, 2, 12, 13, 0, 0, 0, time.UTC)}, nop); !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("replay of a dropped day: %v, want ErrBeyondRetention", err)
	}

	// A drop interrupted between detach and drop is finished next time.
	if _, err := l.db.Exec(fmt.Sprintf("ALTER TABLE %[1]s.processed_messages DETACH PARTITION %[1]s.processed_messages_p20310217", pq.QuoteIdentifier(l.schema))); err != nil {
		t.Fatal(err)
	}
	clock.Add(24 * time.Hour)
	rep, err = l.mw.ClaimTable().MaintainPartitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(partNames(rep.Dropped)) != "[processed_messages_p20310217:false]" || fmt.Sprint(partNames(rep.Created)) != "[processed_messages_p20310323:true]" {
		t.Fatalf("after an interrupted drop: %+v", rep)
	}
	if err := l.db.QueryRow("SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'processed_messages_p20310217'", l.schema).Scan(&leftovers); err != nil || leftovers != 0 {
		t.Fatalf("the detached day is still there (%d, %v)", leftovers, err)
	}
}

// TestMissingPartitionIsNotTooOld: a message dated after the days created
// ahead is in the future (ErrInvalidEventTime, before any transaction); a day
// inside the window whose partition is gone is ErrNoPartition, transient,
// never ErrBeyondRetention, which means too old.
func TestMissingPartitionIsNotTooOld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock := partitionedLoyalty(t, time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC), 3)
	ran := 0
	count := func(context.Context, *sql.Tx) error { ran++; return nil }
	check := func(name string, err error) {
		t.Helper()
		var pqErr *pq.Error
		if !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) || !errors.As(err, &pqErr) || pqErr.Code != "23514" {
			t.Fatalf("%s: %v, want ErrNoPartition from SQLSTATE 23514", name, err)
		}
	}

	// Beyond the days created ahead (the last is 17 March), and beyond the
	// clock: refused before the claim.
	_, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "future", EventTime: time.Date(2031, 3, 19, 1, 0, 0, 0, time.UTC)}, count)
	if !errors.Is(err, idempotent.ErrInvalidEventTime) || errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("event after the last partition: %v, want ErrInvalidEventTime", err)
	}
	// Inside the window, but the day's partition is gone.
	if _, err := l.db.Exec("DROP TABLE " + pq.QuoteIdentifier(l.schema) + ".processed_messages_p20310310"); err != nil {
		t.Fatal(err)
	}
	_, err = l.mw.ProcessMessage(ctx, idempotent.Message{Key: "gap", EventTime: time.Date(2031, 3, 10, 9, 0, 0, 0, time.UTC)}, count)
	check("event on a dropped day", err)
	if !strings.Contains(err.Error(), "has no partition for event day 2031-03-10") {
		t.Errorf("error does not name the day: %v", err)
	}
	// ClaimMessage in the caller's transaction.
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "gap", EventTime: time.Date(2031, 3, 10, 9, 0, 0, 0, time.UTC)})
	_ = tx.Rollback()
	check("ClaimMessage on a dropped day", err)
	// A batch whose claim statement has a row for the dropped day fails
	// whole: its rows for the days that exist are not written either.
	_, err = l.mw.ProcessMessages(ctx, []idempotent.Message{
		{Key: "batch-ok", EventTime: time.Date(2031, 3, 13, 9, 0, 0, 0, time.UTC)},
		{Key: "batch-gap", EventTime: time.Date(2031, 3, 10, 9, 0, 0, 0, time.UTC)},
	}, func(context.Context, *sql.Tx, []int) error { ran++; return nil })
	check("a batch with a message on a dropped day", err)
	if !strings.Contains(err.Error(), "has no partition for one of the event days 2031-03-10, 2031-03-13") {
		t.Errorf("error does not name the batch's days: %v", err)
	}
	if ran != 0 || retCount(t, l.db, l.schema+".processed_messages", "") != 0 {
		t.Fatalf("handler ran %d times; want nothing written", ran)
	}
	// Once its day has come and its partition exists, the message applies.
	clock.Add(5 * 24 * time.Hour)
	if _, err := l.mw.ClaimTable().MaintainPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "future", EventTime: time.Date(2031, 3, 19, 1, 0, 0, 0, time.UTC)}, count); got != idempotent.Applied || err != nil {
		t.Fatalf("the event once its day exists = (%v, %v)", got, err)
	}
}

func TestPartitionedModeNeedsTheEventTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, _ := partitionedLoyalty(t, time.Now(), 1)
	ran := 0
	fn := func(context.Context, *sql.Tx) error { ran++; return nil }
	if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, fn); err == nil || !strings.Contains(err.Error(), "is partitioned by event day: give the message its event time (Message.EventTime)") {
		t.Fatalf("Process: %v", err)
	}
	h := idempotent.WrapMessage(l.mw, func(s string) (idempotent.Message, error) { return idempotent.Message{Key: s}, nil }, func(context.Context, *sql.Tx, string) error { ran++; return nil })
	if _, err := h(ctx, "k"); err == nil || !strings.Contains(err.Error(), "partitioned by event day") {
		t.Fatalf("WrapMessage: %v", err)
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "k"}); err == nil || !strings.Contains(err.Error(), "partitioned by event day") {
		t.Fatalf("Claim: %v", err)
	}
	_ = tx.Rollback()
	if _, err := l.mw.ClaimTable().CleanupConsumer(ctx, l.mw.Config().Consumer, idempotent.DefaultCleanupOptions()); err == nil || !strings.Contains(err.Error(), "MaintainPartitions drops old days instead") {
		t.Fatalf("Cleanup: %v", err)
	}
	if ran != 0 || retCount(t, l.db, l.schema+".processed_messages", "") != 0 {
		t.Fatalf("handler ran %d times; want nothing written", ran)
	}
}

func TestSchemaModeMismatchIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t)
	schema := tempSchema(t, db)
	plain := retMiddleware(t, db, schema+".plain", "loyalty")
	parted := retMiddleware(t, db, schema+".parted", "loyalty", idempotent.WithDailyPartitions(1))

	onPlain, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".plain"), idempotent.WithDailyPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := onPlain.EnsureSchema(ctx); err == nil || !strings.Contains(err.Error(), schema+".plain exists and is not partitioned") {
		t.Fatalf("partitioned EnsureSchema on a plain table: %v", err)
	}
	if _, err := onPlain.ClaimTable().MaintainPartitions(ctx); !errors.Is(err, idempotent.ErrNotPartitioned) {
		t.Fatalf("MaintainPartitions on a plain table: %v", err)
	}
	onParted, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".parted"))
	if err != nil {
		t.Fatal(err)
	}
	if err := onParted.EnsureSchema(ctx); err == nil || !strings.Contains(err.Error(), schema+".parted is partitioned, but the Middleware was not given WithDailyPartitions") {
		t.Fatalf("plain EnsureSchema on a partitioned table: %v", err)
	}
	if _, err := onParted.ClaimTable().CleanupConsumer(ctx, onParted.Config().Consumer, idempotent.DefaultCleanupOptions()); err == nil || !strings.Contains(err.Error(), "is partitioned") {
		t.Fatalf("plain Cleanup on a partitioned table: %v", err)
	}
	if _, err := plain.ClaimTable().MaintainPartitions(ctx); err == nil || !strings.Contains(err.Error(), "not in partitioned mode") {
		t.Fatalf("MaintainPartitions in plain mode: %v", err)
	}
	missing, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".nope"), idempotent.WithDailyPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := missing.ClaimTable().MaintainPartitions(ctx); !errors.Is(err, idempotent.ErrNoClaimTable) || !strings.Contains(err.Error(), schema+".nope") {
		t.Fatalf("MaintainPartitions on a missing table: %v", err)
	}
	if _, err := missing.ClaimTable().Partitions(ctx); !errors.Is(err, idempotent.ErrNoClaimTable) {
		t.Fatalf("Partitions of a missing table: %v", err)
	}
	// A batch has no event times to choose partitions by: refused, nothing sent.
	ran := false
	if _, err := parted.ProcessMessages(ctx, keyMessages("a", "b"), func(context.Context, *sql.Tx, []int) error { ran = true; return nil }); err == nil || !strings.Contains(err.Error(), "partitioned by event day") || ran {
		t.Fatalf("ProcessMessages without event times in partitioned mode: %v (handler ran: %v)", err, ran)
	}
	if n := retCount(t, db, schema+".parted", ""); n != 0 {
		t.Fatalf("%d claims after a refused batch, want 0", n)
	}
}

func TestMaintainPartitionsConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t)
	table := tempSchema(t, db) + ".processed_messages"
	start := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	clock := testenv.NewClock(start)
	retMiddleware(t, db, table, "loyalty", idempotent.WithDailyPartitions(3), idempotent.WithClock(clock.Now))
	clock.Add(10 * 24 * time.Hour)

	var mu sync.Mutex
	var created, dropped []string
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		mw, err := idempotent.New(db, postgres.New(), fmt.Sprintf("c%d", i), idempotent.WithTable(table),
			idempotent.WithDailyPartitions(3), idempotent.WithClock(clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := mw.ClaimTable().MaintainPartitions(ctx)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			created = append(created, partNames(rep.Created)...)
			dropped = append(dropped, partNames(rep.Dropped)...)
		}()
	}
	wg.Wait()
	sort.Strings(created)
	sort.Strings(dropped)
	if want := dayNames(partDay(2031, 3, 18), partDay(2031, 3, 27)); fmt.Sprint(created) != fmt.Sprint(want) {
		t.Fatalf("created (all runners) %v\nwant %v", created, want)
	}
	if want := dayNames(partDay(2031, 2, 12), partDay(2031, 2, 21)); fmt.Sprint(dropped) != fmt.Sprint(want) {
		t.Fatalf("dropped (all runners) %v\nwant %v", dropped, want)
	}
}
