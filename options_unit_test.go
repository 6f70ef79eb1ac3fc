package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// bareDialect is the Postgres dialect without a lock timeout or a
// transaction id, like a dialect that cannot offer them.
type bareDialect struct{ *postgres.Dialect }

func (bareDialect) Name() string                        { return "bare" }
func (bareDialect) LockTimeoutSQL(time.Duration) string { return "" }
func (bareDialect) TxIDSQL() string                     { return "" }

// unorderedDialect is a dialect with only the methods of dialect.Dialect:
// no dialect.Orderer.
type unorderedDialect struct{ dialect.Dialect }

func release(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return nil }

func TestNewRejects(t *testing.T) {
	db, _ := sqlmockDB(t)
	cases := []struct {
		name     string
		db       *sql.DB
		d        dialect.Dialect
		consumer string
		opts     []idempotent.Option
		want     string
		is       error
	}{
		{name: "nil db", d: pg, consumer: "c", want: "nil *sql.DB"},
		{name: "nil dialect", db: db, consumer: "c", want: "nil dialect"},
		{name: "empty consumer", db: db, d: pg, want: "invalid consumer name: empty", is: idempotent.ErrInvalidConsumer},
		{name: "long consumer", db: db, d: pg, consumer: strings.Repeat("c", 129), want: "129 bytes, the limit is 128", is: idempotent.ErrInvalidConsumer},
		{name: "space in consumer", db: db, d: pg, consumer: "loy alty", want: `consumer name "loy alty": ' ' at byte 3`, is: idempotent.ErrInvalidConsumer},
		{name: "consumer starts with punctuation", db: db, d: pg, consumer: ".loyalty", want: `'.' at byte 0`, is: idempotent.ErrInvalidConsumer},
		{name: "non-ASCII consumer", db: db, d: pg, consumer: "lóyalty", want: "at byte 1", is: idempotent.ErrInvalidConsumer},
		{name: "nil option", db: db, d: pg, consumer: "c", opts: []idempotent.Option{nil}, want: "nil option"},
		{name: "table with two dots", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithTable("a.b.c")}, want: `table name "a.b.c"`, is: dialect.ErrInvalidIdentifier},
		{name: "table starting with a digit", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithTable("1claims")}, want: `"1claims" has '1' at byte 0`, is: dialect.ErrInvalidIdentifier},
		{name: "empty table", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithTable("")}, is: dialect.ErrInvalidIdentifier},
		{name: "quote in table", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithTable(`claims"; DROP TABLE x; --`)}, is: dialect.ErrInvalidIdentifier},
		{name: "read-only transactions", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithTxOptions(sql.TxOptions{ReadOnly: true})}, want: "read-only transaction cannot insert a claim"},
		{name: "zero lock timeout", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithLockTimeout(0)}, want: "WithLockTimeout: 0s is not a positive duration"},
		{name: "negative lock timeout", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithLockTimeout(-time.Second)}, want: "-1s is not a positive duration"},
		{name: "nil observer", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithObserver(nil)}, want: "WithObserver: nil observer"},
		{name: "lock timeout on a dialect without", db: db, d: bareDialect{pg}, consumer: "c", opts: []idempotent.Option{idempotent.WithLockTimeout(time.Second)}, want: "the bare dialect cannot bound lock waits"},
		{name: "strict guard on a dialect without", db: db, d: bareDialect{pg}, consumer: "c", opts: []idempotent.Option{idempotent.WithStrictGuard()}, want: "the bare dialect cannot identify transactions"},
		{name: "ordering on a dialect without", db: db, d: unorderedDialect{pg}, consumer: "c", opts: []idempotent.Option{idempotent.WithOrdering(idempotent.Ordering{Release: release})}, want: "the postgres dialect cannot keep messages in order"},
		{name: "ordering without Release", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithOrdering(idempotent.Ordering{})}, want: "WithOrdering: nil Release"},
		{name: "negative gap timeout", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithOrdering(idempotent.Ordering{Release: release, GapTimeout: -time.Second})}, want: "GapTimeout -1s is negative"},
		{name: "dead-letter policy without a function", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithOrdering(idempotent.Ordering{Release: release, Policy: idempotent.GapDeadLetter})}, want: "GapDeadLetter needs a DeadLetter function"},
		{name: "dead-letter function under hold", db: db, d: pg, consumer: "c", opts: []idempotent.Option{idempotent.WithOrdering(idempotent.Ordering{Release: release, DeadLetter: func(context.Context, idempotent.ParkedMessage) error { return nil }})}, want: "only called under GapDeadLetter, not hold"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mw, err := idempotent.New(c.db, c.d, c.consumer, c.opts...)
			if mw != nil || err == nil {
				t.Fatalf("got (%v, %v), want an error", mw, err)
			}
			if !strings.Contains(err.Error(), c.want) || (c.is != nil && !errors.Is(err, c.is)) {
				t.Fatalf("got %q, want it to contain %q and match %v", err, c.want, c.is)
			}
		})
	}
}

func TestNewAccepts(t *testing.T) {
	db, _ := sqlmockDB(t) // sqlmockDB fails the test if New sends anything
	for _, c := range []struct {
		consumer, table, wantTable string
	}{
		{"loyalty", "", "processed_messages"},
		{"loyalty/eu-1:v2.3_x", "claims", "claims"},
		{strings.Repeat("c", 128), "ops.processed_messages", "ops.processed_messages"},
		{"9lives", "_t", "_t"},
	} {
		opts := []idempotent.Option{idempotent.WithObserver(&idempotent.Counts{}), idempotent.WithLockTimeout(time.Second),
			idempotent.WithStrictGuard(), idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable})}
		if c.table != "" {
			opts = append(opts, idempotent.WithTable(c.table))
		}
		mw, err := idempotent.New(db, pg, c.consumer, opts...)
		if err != nil {
			t.Fatalf("%q: %v", c.consumer, err)
		}
		if cfg := mw.Config(); cfg.Consumer != c.consumer || cfg.Table != c.wantTable || cfg.Dialect != pg {
			t.Fatalf("Config: %q %q %v", cfg.Consumer, cfg.Table, cfg.Dialect)
		}
	}
}

func TestConfig(t *testing.T) {
	db, _ := sqlmockDB(t)
	clock := func() time.Time { return time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC) }
	t.Run("defaults", func(t *testing.T) {
		mw, err := idempotent.New(db, pg, consumer)
		if err != nil {
			t.Fatal(err)
		}
		cfg := mw.Config()
		if cfg.Consumer != consumer || cfg.Dialect != pg || cfg.Table != idempotent.DefaultTable ||
			cfg.Retention != idempotent.DefaultRetention || cfg.ClockSkew != idempotent.DefaultClockSkew ||
			cfg.PartitionLeadDays != 0 || cfg.Partitioned() || cfg.LockTimeout != 0 || cfg.StrictGuard || cfg.Clock == nil {
			t.Fatalf("Config() = %+v, want the defaults", cfg)
		}
		if d := time.Since(cfg.Clock()); d < 0 || d > time.Minute {
			t.Fatalf("the default clock is %v off time.Now", d)
		}
	})
	t.Run("every option it reports", func(t *testing.T) {
		mw, err := idempotent.New(db, pg, consumer, idempotent.WithTable("shop.claims"), idempotent.WithRetention(48*time.Hour),
			idempotent.WithClockSkew(time.Minute), idempotent.WithClock(clock), idempotent.WithDailyPartitions(3),
			idempotent.WithLockTimeout(2*time.Second), idempotent.WithStrictGuard())
		if err != nil {
			t.Fatal(err)
		}
		cfg := mw.Config()
		if cfg.Table != "shop.claims" || cfg.Table != mw.ClaimTable().Name() || cfg.Retention != 48*time.Hour ||
			cfg.ClockSkew != time.Minute || !cfg.Clock().Equal(clock()) || cfg.PartitionLeadDays != 3 || !cfg.Partitioned() ||
			cfg.LockTimeout != 2*time.Second || !cfg.StrictGuard {
			t.Fatalf("Config() = %+v", cfg)
		}
		cfg.Table, cfg.Retention = "other", time.Hour
		if again := mw.Config(); again.Table != "shop.claims" || again.Retention != 48*time.Hour {
			t.Fatalf("changing a Config changed the Middleware's: %+v", again)
		}
	})
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[idempotent.Outcome]string{
		idempotent.Applied:   "applied",
		idempotent.Duplicate: "duplicate",
		0:                    "none", // a failed delivery's
		7:                    "Outcome(7)",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", int(o), got, want)
		}
	}
}

func TestCounts(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		var c idempotent.Counts
		ctx := context.Background()
		c.Outcome(ctx, idempotent.Event{Outcome: idempotent.Applied})
		c.Outcome(ctx, idempotent.Event{Outcome: idempotent.Duplicate})
		c.Outcome(ctx, idempotent.Event{Outcome: idempotent.Duplicate})
		c.Outcome(ctx, idempotent.Event{Err: errHandler})
		c.Outcome(ctx, idempotent.Event{Outcome: idempotent.Applied, Err: errHandler}) // an error wins
		c.Outcome(ctx, idempotent.Event{})                                             // nothing to count
		c.Retry(ctx, idempotent.RetryEvent{})
		if c.Applied() != 1 || c.Duplicates() != 2 || c.Failed() != 2 || c.Retries() != 1 {
			t.Fatalf("counts applied %d, duplicates %d, failed %d, retries %d; want 1, 2, 2, 1", c.Applied(), c.Duplicates(), c.Failed(), c.Retries())
		}
	})
	t.Run("observing a middleware", func(t *testing.T) {
		r := newRecorded(t)
		var c idempotent.Counts
		mw := newMiddleware(t, r, idempotent.WithObserver(&c))
		// applied after one retry, then a duplicate, then a failure
		r.mock.ExpectBegin()
		r.mock.ExpectExec(claimSQL).WithArgs(consumer, key).WillReturnError(&pq.Error{Code: "40001"})
		r.mock.ExpectRollback()
		expectApplied(r.mock, key)
		r.mock.ExpectBegin()
		expectClaim(r.mock, key, 0)
		r.mock.ExpectRollback()
		r.mock.ExpectBegin().WillReturnError(errHandler)
		ctx := context.Background()
		_, _ = mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect)
		_, _ = mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect)
		_, _ = mw.ProcessMessage(ctx, idempotent.Message{Key: key}, effect)
		_, _ = mw.ProcessMessage(ctx, idempotent.Message{Key: ""}, effect)
		if c.Applied() != 1 || c.Duplicates() != 1 || c.Failed() != 2 || c.Retries() != 1 {
			t.Fatalf("counts applied %d, duplicates %d, failed %d, retries %d; want 1, 1, 2, 1", c.Applied(), c.Duplicates(), c.Failed(), c.Retries())
		}
	})
}

// TestConfigClaimError: the one mapping of a claim statement's failure, as
// the Middleware and the driver packages use it.
func TestConfigClaimError(t *testing.T) {
	db, _ := sqlmockDB(t)
	plain, err := idempotent.New(db, pg, consumer, idempotent.WithTable("shop.claims"), idempotent.WithLockTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	parted, err := idempotent.New(db, pg, consumer, idempotent.WithDailyPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	day1, day2 := time.Date(2031, 3, 14, 23, 0, 0, 0, time.UTC), time.Date(2031, 3, 15, 1, 0, 0, 0, time.UTC)
	noPartition := &pq.Error{Code: "23514"}
	for _, c := range []struct {
		name string
		cfg  idempotent.Config
		err  error
		ats  []time.Time
		want error
		says string
	}{
		{"lock timeout, WithLockTimeout's", plain.Config(), &pq.Error{Code: "55P03"}, nil, idempotent.ErrClaimBusy, "(lock timeout 1s)"},
		{"lock timeout, the database's", parted.Config(), &pq.Error{Code: "55P03"}, nil, idempotent.ErrClaimBusy, "held by another transaction: pq"},
		{"no claim table", plain.Config(), &pq.Error{Code: "42P01"}, nil, idempotent.ErrNoClaimTable, "shop.claims"},
		{"no partition, one day", parted.Config(), noPartition, []time.Time{day1, day1}, idempotent.ErrNoPartition, "no partition for event day 2031-03-14 yet (partitions cover the retention window and 3 days ahead"},
		{"no partition, two days", parted.Config(), noPartition, []time.Time{day2, day1}, idempotent.ErrNoPartition, "one of the event days 2031-03-14, 2031-03-15"},
		{"no partition without event times", parted.Config(), noPartition, nil, nil, "idempotent: claim: "},
		{"a plain table's check violation", plain.Config(), noPartition, []time.Time{day1}, nil, "idempotent: claim: "},
		{"anything else", plain.Config(), &pq.Error{Code: "23505"}, nil, nil, "idempotent: claim: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := c.cfg.ClaimError(c.err, c.ats...)
			if !errors.Is(got, c.err) || (c.want != nil && !errors.Is(got, c.want)) || !strings.Contains(got.Error(), c.says) {
				t.Fatalf("ClaimError = %v, want %v saying %q and wrapping the cause", got, c.want, c.says)
			}
			for _, other := range []error{idempotent.ErrClaimBusy, idempotent.ErrNoClaimTable, idempotent.ErrNoPartition} {
				if other != c.want && errors.Is(got, other) {
					t.Fatalf("ClaimError = %v also matches %v", got, other)
				}
			}
		})
	}
}
