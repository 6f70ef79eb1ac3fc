package tests

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// The measurements below fill millions of rows and take minutes, so they run
// only when IDEMPOTENT_MEASURE=1:
//
//	IDEMPOTENT_MEASURE=1 go test -run 'TestMeasure(Cleanup|PartitionDrop)' -v -timeout 30m ./tests/

func measureGate(t *testing.T) {
	t.Helper()
	if os.Getenv("IDEMPOTENT_MEASURE") != "1" {
		t.Skip("set IDEMPOTENT_MEASURE=1 to run the cleanup and partition-drop measurements")
	}
}

// TestMeasureCleanup fills 1,000,000 expired claims (and 100,000 live ones)
// and cleans them with batches of 10,000 (the default) and 50,000 (the
// guide's), side by side, and with one unbatched DELETE for comparison.
func TestMeasureCleanup(t *testing.T) {
	measureGate(t)
	db := openDB(t)
	ctx := context.Background()
	const expired, live = 1_000_000, 100_000
	type result struct {
		name               string
		took, longest, p50 time.Duration
		batches            int
	}
	var results []result
	for _, batch := range []int{10_000, 50_000, 0} {
		schema := tempSchema(t, db)
		table := schema + ".processed_messages"
		mw := retMiddleware(t, db, table, "loyalty")
		fill := time.Now()
		retInsertClaims(t, db, table, "loyalty", "old", expired, time.Now().AddDate(0, 0, -45))
		retInsertClaims(t, db, table, "loyalty", "live", live, time.Now())
		if _, err := db.Exec("VACUUM ANALYZE " + qtable(table)); err != nil {
			t.Fatal(err)
		}
		t.Logf("filled %d claims in %v", expired+live, time.Since(fill).Round(time.Millisecond))

		var r result
		start := time.Now()
		if batch == 0 {
			r.name = "one DELETE"
			res, err := db.ExecContext(ctx, "DELETE FROM "+qtable(table)+" WHERE processed_at < $1", time.Now().Add(-idempotent.DefaultRetention-idempotent.DefaultClockSkew))
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != expired {
				t.Fatalf("deleted %d", n)
			}
			r.took = time.Since(start)
			r.longest, r.p50, r.batches = r.took, r.took, 1
		} else {
			r.name = fmt.Sprintf("Cleanup, batches of %d", batch)
			opts := idempotent.DefaultCleanupOptions()
			opts.BatchSize = batch
			var took []time.Duration
			opts.Progress = func(p idempotent.CleanupProgress) {
				if p.TimedOut {
					t.Errorf("batch %d timed out", p.Batch)
				}
				took = append(took, p.Took)
			}
			n, err := mw.Cleanup(ctx, opts)
			if err != nil || n != expired {
				t.Fatalf("Cleanup = (%d, %v)", n, err)
			}
			r.took = time.Since(start)
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			r.longest, r.p50, r.batches = took[len(took)-1], took[len(took)/2], len(took)
		}
		if left := retCount(t, db, table, ""); left != live {
			t.Fatalf("%d claims left, want the %d live ones", left, live)
		}
		results = append(results, r)
		t.Logf("%-28s %8v  %9.0f rows/s  %4d batches  median batch %v  longest batch %v", r.name, r.took.Round(time.Millisecond),
			float64(expired)/r.took.Seconds(), r.batches, r.p50.Round(time.Millisecond), r.longest.Round(time.Millisecond))
		if _, err := db.Exec("DROP SCHEMA " + pq.QuoteIdentifier(schema) + " CASCADE; CREATE SCHEMA " + pq.QuoteIdentifier(schema)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("longest batch of 10,000 vs the single DELETE: %.3fx", float64(results[0].longest)/float64(results[2].longest))
}

// TestMeasurePartitionDrop drops a day holding 10,000 claims and a day
// holding 1,000,000 claims with MaintainPartitions, timing each.
func TestMeasurePartitionDrop(t *testing.T) {
	measureGate(t)
	db := openDB(t)
	ctx := context.Background()
	table := tempSchema(t, db) + ".processed_messages"
	d1 := time.Date(2031, 3, 1, 0, 0, 0, 0, time.UTC)
	d2 := d1.AddDate(0, 0, 1)
	clock := newRetClock(d2.Add(12 * time.Hour))
	opts := []idempotent.Option{idempotent.WithRetention(24 * time.Hour), idempotent.WithClockSkew(0), idempotent.WithClock(clock.Now)}
	// Make the days ahead first, so the measured runs only drop.
	retMiddleware(t, db, table, "loyalty", append(opts, idempotent.WithDailyPartitions(10))...)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", append(opts, idempotent.WithTable(table), idempotent.WithDailyPartitions(3))...)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		day time.Time
		n   int
	}{{d1, 10_000}, {d2, 1_000_000}} {
		start := time.Now()
		if _, err := db.Exec("INSERT INTO "+qtable(table)+" (consumer, message_key, event_day) SELECT 'loyalty', 'k-' || g, $1::date FROM generate_series(1, $2::int) g",
			f.day.Format(time.DateOnly), f.n); err != nil {
			t.Fatal(err)
		}
		t.Logf("filled %s with %d claims in %v", f.day.Format(time.DateOnly), f.n, time.Since(start).Round(time.Millisecond))
	}
	if _, err := db.Exec("ANALYZE " + qtable(table)); err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for i, n := range []int{10_000, 1_000_000} {
		clock.Add(24 * time.Hour)
		start := time.Now()
		rep, err := mw.MaintainPartitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
		if len(rep.Dropped) != 1 || len(rep.Created) != 0 {
			t.Fatalf("run %d: %+v", i, rep)
		}
		t.Logf("dropped %s (%d claims) in %v", rep.Dropped[0].Name, n, took[i].Round(time.Millisecond))
	}
	t.Logf("drop of 1,000,000 claims / drop of 10,000 claims: %.2fx", float64(took[1])/float64(took[0]))
	if left := retCount(t, db, table, ""); left != 0 {
		t.Fatalf("%d claims left", left)
	}
}
