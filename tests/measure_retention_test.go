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
	"github.com/txclaim/idempotent/internal/testenv"
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
// guide's), side by side with the guide's ctid IN form of the batch and one
// unbatched DELETE for comparison.
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
	for _, batch := range []int{10_000, 50_000, -10_000, 0} {
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
		if batch < 0 {
			// The guide's form of the batch, for comparison with the
			// dialect's ctid = ANY (ARRAY(…)).
			r.name = fmt.Sprintf("guide's ctid IN, batches of %d", -batch)
			cutoff := time.Now().Add(-idempotent.DefaultRetention - idempotent.DefaultClockSkew)
			q := fmt.Sprintf("DELETE FROM %[1]s WHERE processed_at < $1 AND consumer = $3 AND ctid IN (SELECT ctid FROM %[1]s WHERE processed_at < $1 AND consumer = $3 LIMIT $2)", qtable(table))
			var took []time.Duration
			var total int64
			for {
				bs := time.Now()
				res, err := db.ExecContext(ctx, q, cutoff, -batch, "loyalty")
				if err != nil {
					t.Fatal(err)
				}
				took = append(took, time.Since(bs))
				n, _ := res.RowsAffected()
				total += n
				if n == 0 {
					break
				}
			}
			if total != expired {
				t.Fatalf("deleted %d", total)
			}
			r.took = time.Since(start)
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			r.longest, r.p50, r.batches = took[len(took)-1], took[len(took)/2], len(took)
		} else if batch == 0 {
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
			n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
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
	t.Logf("Cleanup (batches of 10,000) vs the guide's ctid IN form: %.2fx the time; longest batch of 10,000 vs the single DELETE: %.2fx",
		float64(results[0].took)/float64(results[2].took), float64(results[0].longest)/float64(results[3].longest))
}

// TestMeasurePartitionDrop drops days holding 10,000 claims and days
// holding 1,000,000 claims with MaintainPartitions, alternately, three of
// each, and compares the median times.
func TestMeasurePartitionDrop(t *testing.T) {
	measureGate(t)
	db := openDB(t)
	ctx := context.Background()
	table := tempSchema(t, db) + ".processed_messages"
	d1 := time.Date(2031, 3, 1, 0, 0, 0, 0, time.UTC)
	clock := testenv.NewClock(d1.Add(36 * time.Hour)) // the window starts on d1
	opts := []idempotent.Option{idempotent.WithRetention(24 * time.Hour), idempotent.WithClockSkew(0), idempotent.WithClock(clock.Now)}
	// Make the days ahead first, so the measured runs only drop.
	retMiddleware(t, db, table, "loyalty", append(opts, idempotent.WithDailyPartitions(10))...)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", append(opts, idempotent.WithTable(table), idempotent.WithDailyPartitions(3))...)
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 3
	sizes := []int{10_000, 1_000_000}
	for i := 0; i < 2*rounds; i++ {
		day, n := d1.AddDate(0, 0, i), sizes[i%2]
		start := time.Now()
		if _, err := db.Exec("INSERT INTO "+qtable(table)+" (consumer, message_key, event_day) SELECT 'loyalty', 'k-' || g, $1::date FROM generate_series(1, $2::int) g",
			day.Format(time.DateOnly), n); err != nil {
			t.Fatal(err)
		}
		t.Logf("filled %s with %d claims in %v", day.Format(time.DateOnly), n, time.Since(start).Round(time.Millisecond))
	}
	// Thirty days on, the days have long been written out: checkpoint so
	// that the drops do not measure freshly dirtied buffers.
	if _, err := db.Exec("ANALYZE " + qtable(table) + "; CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	took := map[int][]time.Duration{}
	for i := 0; i < 2*rounds; i++ {
		n := sizes[i%2]
		clock.Add(24 * time.Hour)
		start := time.Now()
		rep, err := mw.ClaimTable().MaintainPartitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		took[n] = append(took[n], d)
		if len(rep.Dropped) != 1 || len(rep.Created) != 0 {
			t.Fatalf("run %d: %+v", i, rep)
		}
		t.Logf("dropped %s (%d claims) in %v", rep.Dropped[0].Name, n, d.Round(time.Millisecond))
	}
	median := func(ds []time.Duration) time.Duration {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	small, big := median(took[10_000]), median(took[1_000_000])
	t.Logf("median drop of a day: 10,000 claims %v, 1,000,000 claims %v", small.Round(time.Millisecond), big.Round(time.Millisecond))
	t.Logf("drop of 1,000,000 claims / drop of 10,000 claims: %.2fx", float64(big)/float64(small))
	if left := retCount(t, db, table, ""); left != 0 {
		t.Fatalf("%d claims left", left)
	}
}
