package main

import (
	"context"
	"database/sql"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
)

func cmdStats(ctx context.Context, args []string, e env) error {
	c := newCommand("stats", "Prints the claims per consumer with the oldest and newest claim, the table and index\nsizes and, for a partitioned table, its partitions. It counts every row: on a large\ntable it takes as long as a full scan.", e, true)
	if err := c.parse(args); err != nil {
		return err
	}
	d, tab, err := c.claimTable(ctx)
	if err != nil {
		return err
	}
	defer d.db.Close()
	t, _ := dialect.ParseTable(c.table) // checked by claimTable
	q := t.Quoted(pq.QuoteIdentifier)

	var exists, partitioned bool
	if err := d.db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL,
       coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`, q).Scan(&exists, &partitioned); err != nil {
		return d.clean(err)
	}
	if !exists {
		return fmt.Errorf("claim table %s does not exist (run idempotent migrate)", c.table)
	}
	var tableBytes, indexBytes int64
	sizes := `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`
	if partitioned {
		sizes = `SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint, coalesce(sum(pg_indexes_size(relid)), 0)::bigint
FROM pg_partition_tree($1::regclass)`
	}
	if err := d.db.QueryRowContext(ctx, sizes, q).Scan(&tableBytes, &indexBytes); err != nil {
		return d.clean(err)
	}
	consumers, err := tab.Stats(ctx)
	if err != nil {
		return d.clean(err)
	}
	var total int64
	for _, c := range consumers {
		total += c.Claims
	}

	kind := "plain"
	if partitioned {
		kind = "partitioned by event day"
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "table\t%s (%s)\n", c.table, kind)
	fmt.Fprintf(w, "size\ttable %s, indexes %s\n", humanBytes(tableBytes), humanBytes(indexBytes))
	fmt.Fprintf(w, "claims\t%d\n", total)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "CONSUMER\tCLAIMS\tOLDEST\tNEWEST")
	for _, c := range consumers {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", c.Consumer, c.Claims, c.Oldest.UTC().Format(time.RFC3339), c.Newest.UTC().Format(time.RFC3339))
	}
	horizons, err := tab.Horizons(ctx)
	if err != nil {
		return d.clean(err)
	}
	fmt.Fprintln(w)
	if len(horizons) == 0 {
		fmt.Fprintln(w, "horizon	none (nothing cleaned up or dropped yet)")
	}
	for _, h := range horizons {
		who := "every consumer"
		if h.Consumer != "" {
			who = "consumer " + h.Consumer
		}
		what := "claims processed before it may be gone"
		if partitioned {
			what = "the days before it were dropped"
		}
		fmt.Fprintf(w, "horizon	%s: %s (%s)\n", who, h.ForgottenBefore.UTC().Format(time.RFC3339), what)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !partitioned {
		return nil
	}

	ps, err := tab.Partitions(ctx)
	if err != nil {
		return d.clean(err)
	}
	counts := map[string]int64{}
	err = query(ctx, d.db, "SELECT c.relname::text, count(*) FROM "+q+" t JOIN pg_class c ON c.oid = t.tableoid GROUP BY 1", nil,
		func(rows *sql.Rows) error {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				return err
			}
			counts[name] = n
			return nil
		})
	if err != nil {
		return d.clean(err)
	}
	partSizes := map[string]int64{}
	err = query(ctx, d.db, `SELECT c.relname::text, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = (SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = $1::regclass) AND c.relkind = 'r'`, []any{q},
		func(rows *sql.Rows) error {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				return err
			}
			partSizes[name] = n
			return nil
		})
	if err != nil {
		return d.clean(err)
	}
	fmt.Fprintln(e.stdout)
	w = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PARTITION\tDAY\tCLAIMS\tSIZE")
	for _, p := range ps {
		state := ""
		if !p.Attached {
			state = " (detached)"
		}
		fmt.Fprintf(w, "%s%s\t%s\t%d\t%s\n", p.Name, state, p.Day.Format(time.DateOnly), counts[p.Name], humanBytes(partSizes[p.Name]))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%d partitions\n", len(ps))
	return nil
}

// query runs q and calls each for every row.
func query(ctx context.Context, db *sql.DB, q string, args []any, each func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
