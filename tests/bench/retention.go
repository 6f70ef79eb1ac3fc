package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// cleanupOptions is what -cleanup measures: Cleanup of expired claims
// with live ones beside them.
type cleanupOptions struct {
	expired, live int
}

// newCleanupOptions returns the options of -cleanup N: N expired claims
// and a tenth as many live ones.
func newCleanupOptions(expired int) (*cleanupOptions, error) {
	if expired < 10 {
		return nil, fmt.Errorf("-cleanup: %d is fewer than 10 expired claims", expired)
	}
	return &cleanupOptions{expired: expired, live: expired / 10}, nil
}

// parseRetention sets the plan's -cleanup and -partitions from their
// flags' values, when set.
func (p *plan) parseRetention(set map[string]bool, cleanup, partitions, rounds int) error {
	if set["cleanup"] {
		o, err := newCleanupOptions(cleanup)
		if err != nil {
			return err
		}
		p.cleanup = o
	}
	if set["partitions"] {
		o, err := newPartitionOptions(partitions, rounds)
		if err != nil {
			return err
		}
		p.partitions = o
	}
	return nil
}

// partitionOptions is what -partitions measures: MaintainPartitions
// dropping days of two sizes, alternately.
type partitionOptions struct {
	small, big, rounds int
}

// newPartitionOptions returns the options of -partitions N: days holding
// N claims and days holding N/100, rounds of each.
func newPartitionOptions(big, rounds int) (*partitionOptions, error) {
	if big < 100 {
		return nil, fmt.Errorf("-partitions: %d is fewer than 100 claims", big)
	}
	return &partitionOptions{small: big / 100, big: big, rounds: rounds}, nil
}

// cleanupResult is one way of deleting the expired claims.
type cleanupResult struct {
	name               string
	took, longest, p50 time.Duration
	batches            int
}

// runCleanup fills o.expired expired claims (and o.live live ones) and
// deletes them with Cleanup in batches of 10,000 (the default) and 50,000
// (the guide's), side by side with the guide's ctid IN form of the batch
// and one unbatched DELETE, each on a fresh table. It writes a Markdown
// section to w.
func runCleanup(ctx context.Context, dsn string, o cleanupOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	db, server, schema, err := openRetentionSchema(ctx, dsn, "cleanup")
	if err != nil {
		return err
	}
	defer dropRetentionSchema(db, schema, log)
	table := schema + ".processed_messages"
	var results []cleanupResult
	for _, batch := range []int{10_000, 50_000, -10_000, 0} {
		mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(table))
		if err != nil {
			return err
		}
		if err := mw.EnsureSchema(ctx); err != nil {
			return err
		}
		fill := time.Now()
		if err := insertClaims(ctx, db, table, "loyalty", "old", o.expired, time.Now().AddDate(0, 0, -45)); err != nil {
			return err
		}
		if err := insertClaims(ctx, db, table, "loyalty", "live", o.live, time.Now()); err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, "VACUUM ANALYZE "+qtable(table)); err != nil {
			return err
		}
		fmt.Fprintf(log, "filled %d claims in %v\n", o.expired+o.live, time.Since(fill).Round(time.Millisecond))

		var r cleanupResult
		start := time.Now()
		if batch < 0 {
			// The guide's form of the batch, for comparison with the
			// dialect's ctid = ANY (ARRAY(…)).
			r.name = fmt.Sprintf("guide's `ctid IN (…)`, batches of %s", thousands(-batch))
			cutoff := time.Now().Add(-idempotent.DefaultRetention - idempotent.DefaultClockSkew)
			q := fmt.Sprintf("DELETE FROM %[1]s WHERE processed_at < $1 AND consumer = $3 AND ctid IN (SELECT ctid FROM %[1]s WHERE processed_at < $1 AND consumer = $3 LIMIT $2)", qtable(table))
			var took []time.Duration
			var total int64
			for {
				bs := time.Now()
				res, err := db.ExecContext(ctx, q, cutoff, -batch, "loyalty")
				if err != nil {
					return err
				}
				took = append(took, time.Since(bs))
				n, _ := res.RowsAffected()
				total += n
				if n == 0 {
					break
				}
			}
			if total != int64(o.expired) {
				return fmt.Errorf("%s: deleted %d claims, want %d", r.name, total, o.expired)
			}
			r.took = time.Since(start)
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			r.longest, r.p50, r.batches = took[len(took)-1], took[len(took)/2], len(took)
		} else if batch == 0 {
			r.name = "one unbatched `DELETE`"
			res, err := db.ExecContext(ctx, "DELETE FROM "+qtable(table)+" WHERE processed_at < $1", time.Now().Add(-idempotent.DefaultRetention-idempotent.DefaultClockSkew))
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != int64(o.expired) {
				return fmt.Errorf("%s: deleted %d claims, want %d", r.name, n, o.expired)
			}
			r.took = time.Since(start)
			r.longest, r.p50, r.batches = r.took, r.took, 1
		} else {
			r.name = fmt.Sprintf("`Cleanup`, batches of %s", thousands(batch))
			if batch == idempotent.DefaultCleanupOptions().BatchSize {
				r.name += " (default)"
			}
			opts := idempotent.DefaultCleanupOptions()
			opts.BatchSize = batch
			var took []time.Duration
			var timedOut []int
			opts.Progress = func(p idempotent.CleanupProgress) {
				if p.TimedOut {
					timedOut = append(timedOut, p.Batch)
				}
				took = append(took, p.Took)
			}
			n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, opts)
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			if n != int64(o.expired) {
				return fmt.Errorf("%s: deleted %d claims, want %d", r.name, n, o.expired)
			}
			if len(timedOut) > 0 {
				return fmt.Errorf("%s: batches %v timed out", r.name, timedOut)
			}
			r.took = time.Since(start)
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			r.longest, r.p50, r.batches = took[len(took)-1], took[len(took)/2], len(took)
		}
		left, err := countClaims(ctx, db, table)
		if err != nil {
			return err
		}
		if left != int64(o.live) {
			return fmt.Errorf("%s: %d claims left, want the %d live ones", r.name, left, o.live)
		}
		results = append(results, r)
		fmt.Fprintf(log, "%-40s %8v\n", r.name, r.took.Round(time.Millisecond))
		if _, err := db.ExecContext(ctx, "DROP SCHEMA "+pq.QuoteIdentifier(schema)+" CASCADE; CREATE SCHEMA "+pq.QuoteIdentifier(schema)); err != nil {
			return err
		}
	}
	cleanupReport(w, server, args, o, started, time.Since(started), results)
	return nil
}

// cleanupReport writes the section of -cleanup: one row per way of
// deleting, in the order runCleanup measures them (Cleanup by 10,000, by
// 50,000, the guide's form by 10,000, one DELETE).
func cleanupReport(w io.Writer, server string, args []string, o cleanupOptions, started time.Time, took time.Duration, results []cleanupResult) {
	fmt.Fprintf(w, "## Cleanup of expired claims\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; lib/pq.\n\n", runLine(started, took, server))
	fmt.Fprintf(w, "%s expired claims, plus %s live ones that must survive, after `VACUUM ANALYZE`; each way on a fresh table:\n\n",
		thousands(o.expired), thousands(o.live))
	fmt.Fprintln(w, "| how | total | rows/s | batches | median batch | longest batch |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %v | %s | %d | %v | %v |\n", r.name, r.took.Round(time.Millisecond),
			thousands(int(float64(o.expired)/r.took.Seconds())), r.batches, r.p50.Round(time.Millisecond), r.longest.Round(time.Millisecond))
	}
	if len(results) == 4 {
		fmt.Fprintf(w, "\n`Cleanup` (batches of 10,000) vs the guide's `ctid IN (…)` form: %.2f× the time; longest batch of 10,000 vs the single `DELETE`: %.2f×.\n",
			float64(results[0].took)/float64(results[2].took), float64(results[0].longest)/float64(results[3].longest))
	}
}

// runPartitions drops days holding o.small claims and days holding o.big
// claims with MaintainPartitions, alternately, o.rounds of each, and
// compares the median times. It writes a Markdown section to w.
func runPartitions(ctx context.Context, dsn string, o partitionOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	db, server, schema, err := openRetentionSchema(ctx, dsn, "partitions")
	if err != nil {
		return err
	}
	defer dropRetentionSchema(db, schema, log)
	table := schema + ".processed_messages"
	d1 := time.Date(2031, 3, 1, 0, 0, 0, 0, time.UTC)
	clock := testenv.NewClock(d1.Add(36 * time.Hour)) // the window starts on d1
	opts := []idempotent.Option{idempotent.WithRetention(24 * time.Hour), idempotent.WithClockSkew(0), idempotent.WithClock(clock.Now), idempotent.WithTable(table)}
	// Make the days ahead first, so the measured runs only drop (10 for
	// 3 rounds).
	ahead, err := idempotent.New(db, postgres.New(), "loyalty", append(opts, idempotent.WithDailyPartitions(2*o.rounds+4))...)
	if err != nil {
		return err
	}
	if err := ahead.EnsureSchema(ctx); err != nil {
		return err
	}
	mw, err := idempotent.New(db, postgres.New(), "loyalty", append(opts, idempotent.WithDailyPartitions(3))...)
	if err != nil {
		return err
	}
	sizes := []int{o.small, o.big}
	for i := 0; i < 2*o.rounds; i++ {
		day, n := d1.AddDate(0, 0, i), sizes[i%2]
		start := time.Now()
		if _, err := db.ExecContext(ctx, "INSERT INTO "+qtable(table)+" (consumer, message_key, event_day) SELECT 'loyalty', 'k-' || g, $1::date FROM generate_series(1, $2::int) g",
			day.Format(time.DateOnly), n); err != nil {
			return err
		}
		fmt.Fprintf(log, "filled %s with %d claims in %v\n", day.Format(time.DateOnly), n, time.Since(start).Round(time.Millisecond))
	}
	// Thirty days on, the days have long been written out: checkpoint so
	// that the drops do not measure freshly dirtied buffers.
	if _, err := db.ExecContext(ctx, "ANALYZE "+qtable(table)+"; CHECKPOINT"); err != nil {
		return err
	}
	took := map[int][]time.Duration{}
	for i := 0; i < 2*o.rounds; i++ {
		n := sizes[i%2]
		clock.Add(24 * time.Hour)
		start := time.Now()
		rep, err := mw.ClaimTable().MaintainPartitions(ctx)
		if err != nil {
			return err
		}
		d := time.Since(start)
		took[n] = append(took[n], d)
		if len(rep.Dropped) != 1 || len(rep.Created) != 0 {
			return fmt.Errorf("run %d: dropped %d days and created %d, want one dropped and none created: %+v", i, len(rep.Dropped), len(rep.Created), rep)
		}
		fmt.Fprintf(log, "dropped %s (%d claims) in %v\n", rep.Dropped[0].Name, n, d.Round(time.Millisecond))
	}
	if left, err := countClaims(ctx, db, table); err != nil {
		return err
	} else if left != 0 {
		return fmt.Errorf("%d claims left after dropping every day", left)
	}
	partitionReport(w, server, args, o, started, time.Since(started), took)
	return nil
}

// partitionReport writes the section of -partitions from the time of each
// drop by the number of claims of the day dropped.
func partitionReport(w io.Writer, server string, args []string, o partitionOptions, started time.Time, took time.Duration, drops map[int][]time.Duration) {
	fmt.Fprintf(w, "## Dropping a day of a partitioned claim table\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; lib/pq.\n\n", runLine(started, took, server))
	fmt.Fprintf(w, "`MaintainPartitions`: detach, then drop, in two transactions; %d day%s of each size alternately, after a checkpoint:\n\n", o.rounds, plural(o.rounds))
	fmt.Fprintln(w, "| day holding | runs | median |")
	fmt.Fprintln(w, "|---|---|---:|")
	med := map[int]time.Duration{}
	for _, n := range []int{o.small, o.big} {
		var runs []string
		for _, d := range drops[n] {
			runs = append(runs, d.Round(time.Millisecond).String())
		}
		ds := append([]time.Duration(nil), drops[n]...)
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		med[n] = ds[len(ds)/2]
		fmt.Fprintf(w, "| %s claims | %s | %v |\n", thousands(n), strings.Join(runs, ", "), med[n].Round(time.Millisecond))
	}
	fmt.Fprintf(w, "\nDrop of %s claims / drop of %s claims: %.2f×.\n", thousands(o.big), thousands(o.small), float64(med[o.big])/float64(med[o.small]))
}

// openRetentionSchema opens a pool on dsn and creates a schema of the
// run's own, named from prefix, for -cleanup and -partitions.
func openRetentionSchema(ctx context.Context, dsn, prefix string) (db *sql.DB, server, schema string, err error) {
	db, err = sql.Open("postgres", dsn)
	if err != nil {
		return nil, "", "", err
	}
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&server); err != nil {
		db.Close()
		return nil, "", "", fmt.Errorf("connect to %s: %w", dsn, err)
	}
	schema = testenv.UniqueName(prefix)
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+pq.QuoteIdentifier(schema)); err != nil {
		db.Close()
		return nil, "", "", err
	}
	return db, server, schema, nil
}

// dropRetentionSchema drops the schema of openRetentionSchema and closes
// the pool.
func dropRetentionSchema(db *sql.DB, schema string, log io.Writer) {
	if _, err := db.ExecContext(context.Background(), "DROP SCHEMA "+pq.QuoteIdentifier(schema)+" CASCADE"); err != nil {
		fmt.Fprintln(log, "drop schema:", err)
	}
	db.Close()
}

// qtable quotes table, schema.name.
func qtable(table string) string {
	schema, name, _ := strings.Cut(table, ".")
	return pq.QuoteIdentifier(schema) + "." + pq.QuoteIdentifier(name)
}

// insertClaims inserts n claims of consumer processed at at, keyed
// prefix-1 … prefix-n.
func insertClaims(ctx context.Context, db *sql.DB, table, consumer, prefix string, n int, at time.Time) error {
	_, err := db.ExecContext(ctx, "INSERT INTO "+qtable(table)+" (consumer, message_key, processed_at) SELECT $1, $2 || '-' || g, $3 FROM generate_series(1, $4::int) g",
		consumer, prefix, at, n)
	if err != nil {
		return fmt.Errorf("insert %d claims: %w", n, err)
	}
	return nil
}

// countClaims counts the claims of table.
func countClaims(ctx context.Context, db *sql.DB, table string) (int64, error) {
	var n int64
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+qtable(table)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count claims: %w", err)
	}
	return n, nil
}
