package tests

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// Integration tests of ClaimTable, the claim table apart from any consumer.

// newTable returns a ClaimTable on table (schema.name), with its schema made
// by EnsureSchema.
func newTable(t testing.TB, db *sql.DB, table string, opts ...idempotent.TableOption) *idempotent.ClaimTable {
	t.Helper()
	tab, err := idempotent.NewClaimTable(db, postgres.New(), append([]idempotent.TableOption{idempotent.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tab.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return tab
}

// One Cleanup call removes the expired claims of every consumer sharing the
// table, and nothing inside the window.
func TestClaimTableCleanupCoversEveryConsumer(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	table := tempSchema(t, db) + ".claims"
	now := time.Now().UTC().Truncate(time.Second)
	tab := newTable(t, db, table, idempotent.WithClock(func() time.Time { return now }))
	cutoff := now.Add(-idempotent.DefaultRetention - idempotent.DefaultClockSkew)
	retInsertClaims(t, db, table, "loyalty", "old", 1200, cutoff.Add(-time.Hour))
	retInsertClaims(t, db, table, "analytics", "old", 300, cutoff.Add(-time.Minute))
	retInsertClaims(t, db, table, "billing", "old", 1, cutoff.Add(-time.Microsecond))
	retInsertClaims(t, db, table, "loyalty", "kept", 5, cutoff)
	retInsertClaims(t, db, table, "analytics", "kept", 7, now)

	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize = 500
	n, err := tab.Cleanup(context.Background(), opts)
	if err != nil || n != 1501 {
		t.Fatalf("Cleanup = (%d, %v), want 1501", n, err)
	}
	if left := retCount(t, db, table, "message_key LIKE 'old-%'"); left != 0 {
		t.Fatalf("%d expired claims left", left)
	}
	for c, want := range map[string]int64{"loyalty": 5, "analytics": 7, "billing": 0} {
		if got := retCount(t, db, table, "consumer = $1", c); got != want {
			t.Errorf("%s: %d claims left, want %d", c, got, want)
		}
	}
}

// CleanupConsumer cleans one consumer with its own, shorter window and
// leaves the claims of the others, even older ones.
func TestClaimTableCleanupConsumerLeavesTheOthers(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	table := tempSchema(t, db) + ".claims"
	now := time.Now().UTC().Truncate(time.Second)
	week := newTable(t, db, table, idempotent.WithRetention(7*24*time.Hour), idempotent.WithClock(func() time.Time { return now }))
	retInsertClaims(t, db, table, "analytics", "old", 250, now.AddDate(0, 0, -10))
	retInsertClaims(t, db, table, "analytics", "new", 3, now.AddDate(0, 0, -6))
	retInsertClaims(t, db, table, "loyalty", "old", 40, now.AddDate(0, 0, -10)) // inside loyalty's 30 days

	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize = 100
	opts.DryRun = true
	if n, err := week.CleanupConsumer(context.Background(), "analytics", opts); err != nil || n != 250 {
		t.Fatalf("dry run = (%d, %v), want 250", n, err)
	}
	opts.DryRun = false
	if n, err := week.CleanupConsumer(context.Background(), "analytics", opts); err != nil || n != 250 {
		t.Fatalf("CleanupConsumer = (%d, %v), want 250", n, err)
	}
	if got := retCount(t, db, table, "consumer = 'analytics'"); got != 3 {
		t.Fatalf("analytics: %d claims left, want the 3 inside its week", got)
	}
	if got := retCount(t, db, table, "consumer = 'loyalty'"); got != 40 {
		t.Fatalf("loyalty: %d claims left, want all 40", got)
	}
}

// Stats counts each consumer's claims with the oldest and the newest.
func TestClaimTableStats(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	schema := tempSchema(t, db)
	table := schema + ".claims"
	tab := newTable(t, db, table)
	ctx := context.Background()
	if got, err := tab.Stats(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Stats of an empty table = (%+v, %v)", got, err)
	}
	t0 := time.Date(2031, 3, 14, 9, 30, 0, 0, time.UTC)
	retInsertClaims(t, db, table, "loyalty", "a", 20, t0)
	retInsertClaims(t, db, table, "loyalty", "b", 5, t0.Add(26*time.Hour))
	retInsertClaims(t, db, table, "analytics", "a", 3, t0.Add(time.Minute))
	got, err := tab.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []idempotent.ConsumerStats{
		{Consumer: "analytics", Claims: 3, Oldest: t0.Add(time.Minute), Newest: t0.Add(time.Minute)},
		{Consumer: "loyalty", Claims: 25, Oldest: t0, Newest: t0.Add(26 * time.Hour)},
	}
	if len(got) != len(want) {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Consumer != want[i].Consumer || got[i].Claims != want[i].Claims || !got[i].Oldest.Equal(want[i].Oldest) || !got[i].Newest.Equal(want[i].Newest) {
			t.Errorf("Stats[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	missing, err := idempotent.NewClaimTable(db, postgres.New(), idempotent.WithTable(schema+".nope"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := missing.Stats(ctx); err == nil || !strings.Contains(err.Error(), "claim table does not exist: "+schema+".nope") {
		t.Fatalf("Stats of a missing table: %v", err)
	}
}

// MaintainPartitions through a ClaimTable creates and drops the same days
// as through a Middleware on a table of its own, with the same clock.
func TestClaimTableMaintainPartitionsAsTheMiddlewareDid(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	schema := tempSchema(t, db)
	ctx := context.Background()
	clock := testenv.NewClock(time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC))
	opts := []idempotent.TableOption{idempotent.WithDailyPartitions(3), idempotent.WithClock(clock.Now)}
	tab := newTable(t, db, schema+".bytable", opts...)
	mw := retMiddleware(t, db, schema+".bymw", "loyalty", options(opts...)...)

	// days returns the days of ps, dropping each table's own name.
	days := func(ps []idempotent.Partition) string {
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%s:%v", p.Day.Format(time.DateOnly), p.Attached))
		}
		return strings.Join(out, " ")
	}
	span := func(first, last time.Time) string {
		var out []string
		for d := first; !d.After(last); d = d.AddDate(0, 0, 1) {
			out = append(out, d.Format(time.DateOnly)+":true")
		}
		return strings.Join(out, " ")
	}
	for _, step := range []struct {
		name                  string
		advance               time.Duration
		created, dropped, all string
	}{
		{"the same day", 0, "", "", span(partDay(2031, 2, 12), partDay(2031, 3, 17))},
		{"five days on", 5 * 24 * time.Hour, span(partDay(2031, 3, 18), partDay(2031, 3, 22)), span(partDay(2031, 2, 12), partDay(2031, 2, 16)), span(partDay(2031, 2, 17), partDay(2031, 3, 22))},
	} {
		clock.Add(step.advance)
		got, err := tab.MaintainPartitions(ctx)
		if err != nil {
			t.Fatalf("%s: ClaimTable: %v", step.name, err)
		}
		old, err := mw.ClaimTable().MaintainPartitions(ctx)
		if err != nil {
			t.Fatalf("%s: Middleware: %v", step.name, err)
		}
		if days(got.Created) != step.created || days(got.Dropped) != step.dropped {
			t.Fatalf("%s: ClaimTable created [%s] dropped [%s]\nwant created [%s] dropped [%s]", step.name, days(got.Created), days(got.Dropped), step.created, step.dropped)
		}
		if days(old.Created) != days(got.Created) || days(old.Dropped) != days(got.Dropped) {
			t.Fatalf("%s: the Middleware created [%s] dropped [%s], the ClaimTable [%s] [%s]", step.name, days(old.Created), days(old.Dropped), days(got.Created), days(got.Dropped))
		}
		ps, err := tab.Partitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if days(ps) != step.all || !strings.HasPrefix(ps[0].Name, "bytable_p") {
			t.Fatalf("%s: partitions [%s] (%s…)\nwant [%s]", step.name, days(ps), ps[0].Name, step.all)
		}
		if mine, err := mw.ClaimTable().Partitions(ctx); err != nil || days(mine) != step.all {
			t.Fatalf("%s: the Middleware's table has [%s] (%v)", step.name, days(mine), err)
		}
	}
	// A partitioned table refuses row cleanup, through either.
	if _, err := tab.Cleanup(ctx, idempotent.DefaultCleanupOptions()); err == nil || !strings.Contains(err.Error(), "is partitioned by day; MaintainPartitions drops old days instead") {
		t.Fatalf("Cleanup of a partitioned table: %v", err)
	}
}
