package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// Unit tests of ClaimTable on go-sqlmock: the statements each method sends,
// in order, and what it refuses before sending anything.

// tableNow is the clock of the ClaimTable tests; tableCutoff is its cleanup
// cutoff under the default window and margin.
var (
	tableNow    = time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	tableCutoff = tableNow.Add(-idempotent.DefaultRetention - idempotent.DefaultClockSkew)
	shopClaims  = dialect.Table{Schema: "shop", Name: "claims"}
)

// newClaimTable returns a ClaimTable on r's database for shop.claims, with
// the fixed clock and no retry backoff.
func newClaimTable(t *testing.T, r *recorded, opts ...idempotent.TableOption) *idempotent.ClaimTable {
	t.Helper()
	base := []idempotent.TableOption{noWait, idempotent.WithTable("shop.claims"), idempotent.WithClock(func() time.Time { return tableNow })}
	tab, err := idempotent.NewClaimTable(r.db, pg, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// expectCleanupBatch scripts one batch of a cleanup that deletes n claims,
// of consumer c ("" for every consumer), and returns the statements: the
// lock, the timeout, the horizon raised again in the deleting transaction,
// the delete.
func expectCleanupBatch(m sqlmock.Sqlmock, c string, size int, n int64) []string {
	lock, _ := pg.CleanupLockSQL(shopClaims)
	timeout := pg.StatementTimeoutSQL(5 * time.Second)
	adv := expectAdvanceHorizon(m, shopClaims, c, tableCutoff, func() {
		m.ExpectBegin()
		m.ExpectQuery(lock).WillReturnRows(sqlmock.NewRows([]string{"ok"}).AddRow(true))
		m.ExpectExec(timeout).WillReturnResult(sqlmock.NewResult(0, 0))
	})
	del, args := pg.CleanupBatchSQL(shopClaims, c, tableCutoff, size)
	m.ExpectExec(del).WithArgs(driverValues(args)...).WillReturnResult(sqlmock.NewResult(0, n))
	m.ExpectCommit()
	return []string{"BEGIN", lock, timeout, adv, del, "COMMIT"}
}

// expectAdvanceHorizon scripts, after what before scripts, the raise of
// consumer c's horizon ("" for the table's row) of t to h, and returns the
// statement.
func expectAdvanceHorizon(m sqlmock.Sqlmock, t dialect.Table, c string, h time.Time, before func()) string {
	before()
	adv, args := pg.AdvanceHorizonSQL(t, c, h)
	m.ExpectExec(adv).WithArgs(driverValues(args)...).WillReturnResult(sqlmock.NewResult(0, 1))
	return adv
}

// expectRaiseHorizon scripts what a cleanup or partition drop does before
// it deletes anything: the horizon of consumer c ("" for the table's row) of
// t raised to h in a transaction of its own, the horizon table read for the
// leases processes declared (none), then the count of sessions on
// older snapshots polled, answering each of snapshots in turn (the last
// must be 0 for the drain to end). It returns the statements.
func expectRaiseHorizon(m sqlmock.Sqlmock, t dialect.Table, c string, h time.Time, snapshots ...int64) []string {
	adv := expectAdvanceHorizon(m, t, c, h, func() { m.ExpectBegin() })
	m.ExpectCommit()
	// The leases processes declared (WithHorizonLease): none.
	leases := pg.HorizonsSQL(t)
	m.ExpectQuery(leases).WillReturnRows(sqlmock.NewRows([]string{"consumer", "forgotten_before"}))
	calls := []string{"BEGIN", adv, "COMMIT", leases}
	older, args := pg.OlderSnapshotsSQL(t, c)
	for _, n := range snapshots {
		m.ExpectQuery(older).WithArgs(driverValues(args)...).WillReturnRows(sqlmock.NewRows([]string{"count"}).AddRow(n))
		calls = append(calls, older)
	}
	return calls
}

// schemaSQL is what EnsureSchema runs for a plain claim table t: its
// schema, then its horizon table's.
func schemaSQL(t dialect.Table) []string {
	return append(pg.SchemaSQL(t), pg.HorizonSchemaSQL(t)...)
}

func TestNewClaimTableRefusesBadInput(t *testing.T) {
	db, _ := sqlmockDB(t) // sends nothing
	for _, c := range []struct {
		name string
		db   *sql.DB
		d    dialect.Dialect
		opts []idempotent.TableOption
		want string
	}{
		{"nil db", nil, pg, nil, "idempotent: NewClaimTable: nil *sql.DB"},
		{"nil dialect", db, nil, nil, "idempotent: NewClaimTable: nil dialect"},
		{"nil option", db, pg, []idempotent.TableOption{nil}, "idempotent: NewClaimTable: nil option"},
		{"bad table", db, pg, []idempotent.TableOption{idempotent.WithTable("a;b")}, `table name "a;b"`},
		{"bad retention", db, pg, []idempotent.TableOption{idempotent.WithRetention(-time.Hour)}, "WithRetention: -1h0m0s is not a positive duration"},
		{"partitions on a plain dialect", db, plainDialect{pg}, []idempotent.TableOption{idempotent.WithDailyPartitions(2)}, "WithDailyPartitions: the postgres dialect does not support partitions"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab, err := idempotent.NewClaimTable(c.db, c.d, c.opts...)
			if err == nil || tab != nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got (%v, %v), want an error containing %q", tab, err, c.want)
			}
		})
	}
}

func TestClaimTableSettings(t *testing.T) {
	db, _ := sqlmockDB(t)
	tab, err := idempotent.NewClaimTable(db, pg, idempotent.WithTable("shop.claims"), idempotent.WithRetention(72*time.Hour), idempotent.WithDailyPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	if tab.Name() != "shop.claims" || tab.Retention() != 72*time.Hour || !tab.Partitioned() {
		t.Fatalf("NewClaimTable: %q, %v, partitioned %v", tab.Name(), tab.Retention(), tab.Partitioned())
	}
	mw, err := idempotent.New(db, pg, consumer, idempotent.WithTable("shop.claims"), idempotent.WithRetention(48*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got := mw.ClaimTable(); got.Name() != "shop.claims" || got.Retention() != 48*time.Hour || got.Partitioned() {
		t.Fatalf("Middleware.ClaimTable: %q, %v, partitioned %v", got.Name(), got.Retention(), got.Partitioned())
	}
}

func TestClaimTableCleanup(t *testing.T) {
	ctx := context.Background()
	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize, opts.MinBatchSize = 1000, 10
	t.Run("every consumer", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		kind := expectTableKind(r.mock, shopClaims, true, false)
		// The horizon first, then the drain: two sessions on older
		// snapshots, then none. Only then a delete.
		calls := append([]string{kind}, expectRaiseHorizon(r.mock, shopClaims, "", tableCutoff, 2, 0)...)
		calls = append(calls, expectCleanupBatch(r.mock, "", 1000, 1000)...)
		calls = append(calls, expectCleanupBatch(r.mock, "", 1000, 0)...)
		if n, err := tab.Cleanup(ctx, opts); n != 1000 || err != nil {
			t.Fatalf("Cleanup = (%d, %v), want 1000", n, err)
		}
		r.wantCalls(t, calls...)
	})
	t.Run("one consumer", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		kind := expectTableKind(r.mock, shopClaims, true, false)
		calls := append([]string{kind}, expectRaiseHorizon(r.mock, shopClaims, "analytics", tableCutoff, 0)...)
		calls = append(calls, expectCleanupBatch(r.mock, "analytics", 1000, 7)...)
		calls = append(calls, expectCleanupBatch(r.mock, "analytics", 1000, 0)...)
		if n, err := tab.CleanupConsumer(ctx, "analytics", opts); n != 7 || err != nil {
			t.Fatalf("CleanupConsumer = (%d, %v), want 7", n, err)
		}
		r.wantCalls(t, calls...)
	})
	t.Run("dry run of one consumer", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		kind := expectTableKind(r.mock, shopClaims, true, false)
		count, _ := pg.CountExpiredSQL(shopClaims, "analytics", tableCutoff)
		r.mock.ExpectQuery(count).WithArgs(tableCutoff, "analytics").WillReturnRows(sqlmock.NewRows([]string{"n"}).AddRow(42))
		dry := opts
		dry.DryRun = true
		if n, err := tab.CleanupConsumer(ctx, "analytics", dry); n != 42 || err != nil {
			t.Fatalf("dry run = (%d, %v), want 42", n, err)
		}
		r.wantCalls(t, kind, count)
	})
	t.Run("the Middleware's table, for its consumer or every one", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithTable("shop.claims"), idempotent.WithClock(func() time.Time { return tableNow }))
		kind := expectTableKind(r.mock, shopClaims, true, false)
		calls := append([]string{kind}, expectRaiseHorizon(r.mock, shopClaims, consumer, tableCutoff, 0)...)
		calls = append(calls, expectCleanupBatch(r.mock, consumer, 1000, 0)...)
		if n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts); n != 0 || err != nil {
			t.Fatalf("CleanupConsumer = (%d, %v)", n, err)
		}
		calls = append(calls, expectTableKind(r.mock, shopClaims, true, false))
		calls = append(calls, expectRaiseHorizon(r.mock, shopClaims, "", tableCutoff, 0)...)
		calls = append(calls, expectCleanupBatch(r.mock, "", 1000, 0)...)
		if n, err := mw.ClaimTable().Cleanup(ctx, opts); n != 0 || err != nil {
			t.Fatalf("Cleanup = (%d, %v)", n, err)
		}
		r.wantCalls(t, calls...)
	})
	t.Run("refused before anything is sent", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		if _, err := tab.CleanupConsumer(ctx, "-x", opts); !errors.Is(err, idempotent.ErrInvalidConsumer) {
			t.Errorf("bad consumer: %v, want ErrInvalidConsumer", err)
		}
		if _, err := tab.Cleanup(ctx, idempotent.CleanupOptions{}); err == nil || !strings.Contains(err.Error(), "idempotent: Cleanup: BatchSize is 0") {
			t.Errorf("zero options: %v", err)
		}
		parted := newClaimTable(t, r, idempotent.WithDailyPartitions(2))
		if _, err := parted.Cleanup(ctx, opts); err == nil || !strings.Contains(err.Error(), "claim table shop.claims is partitioned by day; MaintainPartitions drops old days instead") {
			t.Errorf("partitioned: %v", err)
		}
		plain, err := idempotent.NewClaimTable(r.db, plainDialect{pg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := plain.CleanupConsumer(ctx, "analytics", opts); err == nil || err.Error() != "idempotent: CleanupConsumer: the postgres dialect does not support batched cleanup" {
			t.Errorf("dialect without Cleaner: %v", err)
		}
		r.wantCalls(t)
	})
	t.Run("missing table", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		kind := expectTableKind(r.mock, shopClaims, false, false)
		if _, err := tab.Cleanup(ctx, opts); !errors.Is(err, idempotent.ErrNoClaimTable) || !strings.Contains(err.Error(), "shop.claims") {
			t.Fatalf("got %v, want ErrNoClaimTable naming the table", err)
		}
		r.wantCalls(t, kind)
	})
}

// The upkeep that opens transactions is refused inside a handler, as the
// Middleware's own methods are.
func TestClaimTableRefusedInsideAHandler(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(ctx context.Context, db *sql.DB, tab *idempotent.ClaimTable) error
	}{
		{"EnsureSchema", func(ctx context.Context, _ *sql.DB, tab *idempotent.ClaimTable) error { return tab.EnsureSchema(ctx) }},
		{"Cleanup", func(ctx context.Context, _ *sql.DB, tab *idempotent.ClaimTable) error {
			_, err := tab.Cleanup(ctx, idempotent.DefaultCleanupOptions())
			return err
		}},
		{"CleanupConsumer", func(ctx context.Context, _ *sql.DB, tab *idempotent.ClaimTable) error {
			_, err := tab.CleanupConsumer(ctx, "analytics", idempotent.DefaultCleanupOptions())
			return err
		}},
		{"MaintainPartitions", func(ctx context.Context, db *sql.DB, _ *idempotent.ClaimTable) error {
			parted, err := idempotent.NewClaimTable(db, pg, idempotent.WithDailyPartitions(2))
			if err != nil {
				return err
			}
			_, err = parted.MaintainPartitions(ctx)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			mw := newMiddleware(t, r)
			r.mock.ExpectBegin()
			expectClaim(r.mock, key, 1)
			r.mock.ExpectRollback()
			var nested error
			_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(ctx context.Context, _ *sql.Tx) error {
				nested = c.run(ctx, r.db, mw.ClaimTable())
				return nil
			})
			if !errors.Is(nested, idempotent.ErrAutocommit) || !strings.Contains(nested.Error(), "inside a handler") {
				t.Errorf("nested call: %v, want ErrAutocommit saying a transaction was begun inside a handler", nested)
			}
			if !errors.Is(err, idempotent.ErrAutocommit) {
				t.Errorf("Process: %v, want ErrAutocommit", err)
			}
			r.wantCalls(t, "BEGIN", claimSQL, "ROLLBACK")
		})
	}
}

func TestClaimTableMaintainPartitionsNeedsPartitions(t *testing.T) {
	r := newRecorded(t)
	tab := newClaimTable(t, r)
	if _, err := tab.MaintainPartitions(context.Background()); err == nil ||
		err.Error() != "idempotent: MaintainPartitions: the ClaimTable for shop.claims is not in partitioned mode (WithDailyPartitions)" {
		t.Fatalf("got %v", err)
	}
	r.wantCalls(t)
}

func TestClaimTableStats(t *testing.T) {
	ctx := context.Background()
	stats := pg.StatsSQL(shopClaims)
	t.Run("per consumer", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		old, mid, late := tableNow.Add(-48*time.Hour), tableNow.Add(-time.Hour), tableNow
		r.mock.ExpectQuery(stats).WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"consumer", "count", "min", "max"}).
			AddRow("analytics", 500, old.UnixMicro(), mid.UnixMicro()).AddRow("loyalty", 2510, mid.UnixMicro(), late.UnixMicro()))
		got, err := tab.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []idempotent.ConsumerStats{{"analytics", 500, old, mid}, {"loyalty", 2510, mid, late}}
		if len(got) != len(want) {
			t.Fatalf("Stats = %+v, want %+v", got, want)
		}
		for i := range want {
			if got[i].Consumer != want[i].Consumer || got[i].Claims != want[i].Claims || !got[i].Oldest.Equal(want[i].Oldest) || !got[i].Newest.Equal(want[i].Newest) {
				t.Fatalf("Stats[%d] = %+v, want %+v", i, got[i], want[i])
			}
		}
		r.wantCalls(t, stats)
	})
	t.Run("missing table", func(t *testing.T) {
		r := newRecorded(t)
		tab := newClaimTable(t, r)
		r.mock.ExpectQuery(stats).WithoutArgs().WillReturnError(&pq.Error{Code: "42P01"})
		if _, err := tab.Stats(ctx); !errors.Is(err, idempotent.ErrNoClaimTable) || !strings.Contains(err.Error(), "shop.claims") {
			t.Fatalf("got %v, want ErrNoClaimTable naming the table", err)
		}
	})
	t.Run("dialect without it", func(t *testing.T) {
		r := newRecorded(t)
		tab, err := idempotent.NewClaimTable(r.db, plainDialect{pg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tab.Stats(ctx); err == nil || err.Error() != "idempotent: Stats: the postgres dialect does not support table statistics" {
			t.Fatalf("got %v", err)
		}
		r.wantCalls(t)
	})
}
