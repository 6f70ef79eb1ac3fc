package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/internal/kafkaoffsets"
	"github.com/txclaim/idempotent/migrations"
	"github.com/txclaim/idempotent/outbox"
)

// layout is what stats reports of the table itself: whether it exists and
// is partitioned, its sizes, and the claims in each partition.
type layout struct {
	exists, partitioned    bool
	tableBytes, indexBytes int64
	sizesKnown             bool
	partClaims             map[string]int64 // by partition name
	partBytes              map[string]int64
}

func cmdStats(ctx context.Context, args []string, e env) error {
	if ok, err := forEachTenant(ctx, args, e, cmdStats); ok {
		return err
	}
	c := newCommand("stats", "Prints the claims per consumer with the oldest and newest claim, the table and index\nsizes, the retention horizon and, for a partitioned table, its partitions; then, for those\nthat exist, the HTTP response table's, the outbox's and the kafka offsets table's figures.\nIt counts every row: on a large table it takes as long as a full scan.", e, true)
	c.fs.String("tenants", "", tenantsHelp)
	httpTable := c.fs.String("http-table", "", `the HTTP response table (default: the claim table's name + "_http")`)
	outboxTable := c.fs.String("outbox", "", `the outbox table, Postgres (default: "outbox" in the claim table's schema)`)
	offsetsTable := c.fs.String("kafka-offsets", "", `the kafka offsets table, Postgres (default: "`+migrations.DefaultKafkaOffsetsTable+`" in the claim table's schema)`)
	if err := c.parse(args); err != nil {
		return err
	}
	for name, v := range map[string]string{"http-table": *httpTable, "outbox": *outboxTable, "kafka-offsets": *offsetsTable} {
		if _, err := dialect.ParseTable(v); v != "" && err != nil {
			return usageError{"-" + name + ": " + err.Error()}
		}
	}
	d, tab, err := c.claimTable(ctx)
	if err != nil {
		return err
	}
	defer d.db.Close()
	t, _ := dialect.ParseTable(c.table) // checked by claimTable
	lay, err := d.layout(ctx, t)
	if err != nil {
		return d.clean(err)
	}
	if !lay.exists {
		return fmt.Errorf("claim table %s does not exist (run idempotent migrate)", c.table)
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
	if lay.partitioned {
		kind = "partitioned by event day"
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "database\t%s\n", d.target.kind)
	fmt.Fprintf(w, "table\t%s (%s)\n", c.table, kind)
	if lay.sizesKnown {
		fmt.Fprintf(w, "size\ttable %s, indexes %s\n", humanBytes(lay.tableBytes), humanBytes(lay.indexBytes))
	}
	fmt.Fprintf(w, "claims\t%d\n", total)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "CONSUMER\tCLAIMS\tOLDEST\tNEWEST")
	for _, c := range consumers {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", c.Consumer, c.Claims, c.Oldest.UTC().Format(time.RFC3339), c.Newest.UTC().Format(time.RFC3339))
	}
	horizons, err := tab.Horizons(ctx)
	switch {
	case errors.Is(err, idempotent.ErrNoClaimTable):
		horizons = nil
		fmt.Fprintln(w)
		fmt.Fprintln(w, "horizon\tnone recorded (no horizon table: run idempotent migrate)")
	case err != nil:
		return d.clean(err)
	default:
		fmt.Fprintln(w)
	}
	if err == nil && len(horizons) == 0 {
		fmt.Fprintln(w, "horizon	none (nothing cleaned up or dropped yet)")
	}
	for _, h := range horizons {
		who := "every consumer"
		if h.Consumer != "" {
			who = "consumer " + h.Consumer
		}
		what := "claims processed before it may be gone"
		if lay.partitioned {
			what = "the days before it were dropped"
		}
		fmt.Fprintf(w, "horizon	%s: %s (%s)\n", who, h.ForgottenBefore.UTC().Format(time.RFC3339), what)
	}
	if err := otherTables(ctx, w, d, t, *httpTable, *outboxTable, *offsetsTable); err != nil {
		return d.clean(err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !lay.partitioned {
		return nil
	}
	ps, err := tab.Partitions(ctx)
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
		fmt.Fprintf(w, "%s%s\t%s\t%d\t%s\n", p.Name, state, p.Day.Format(time.DateOnly), lay.partClaims[p.Name], humanBytes(lay.partBytes[p.Name]))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%d partitions\n", len(ps))
	return nil
}

func postgresLayout(ctx context.Context, db *sql.DB, t dialect.Table) (layout, error) {
	lay := layout{partClaims: map[string]int64{}, partBytes: map[string]int64{}, sizesKnown: true}
	q := t.Quoted(pq.QuoteIdentifier)
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL,
       coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`, q).Scan(&lay.exists, &lay.partitioned); err != nil || !lay.exists {
		return lay, err
	}
	sizes := `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`
	if lay.partitioned {
		sizes = `SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint, coalesce(sum(pg_indexes_size(relid)), 0)::bigint
FROM pg_partition_tree($1::regclass)`
	}
	if err := db.QueryRowContext(ctx, sizes, q).Scan(&lay.tableBytes, &lay.indexBytes); err != nil || !lay.partitioned {
		return lay, err
	}
	err := query(ctx, db, "SELECT c.relname::text, count(*) FROM "+q+" t JOIN pg_class c ON c.oid = t.tableoid GROUP BY 1", nil, scanInto(lay.partClaims))
	if err != nil {
		return lay, err
	}
	err = query(ctx, db, `SELECT c.relname::text, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = (SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = $1::regclass) AND c.relkind = 'r'`, []any{q}, scanInto(lay.partBytes))
	return lay, err
}

// layout reads the layout of table t in d's database.
func (d *database) layout(ctx context.Context, t dialect.Table) (layout, error) {
	switch d.target.kind {
	case kindMySQL:
		return mysqlLayout(ctx, d.db, d.target.dialect, t)
	case kindSQLite:
		return sqliteLayout(ctx, d.db, t)
	}
	return postgresLayout(ctx, d.db, t)
}

// beside names table name in the schema of t, the claim table.
func beside(t dialect.Table, name string) string {
	if t.Schema == "" {
		return name
	}
	return t.Schema + "." + name
}

// otherTables prints the figures of the other tables the library writes
// beside the claim table t, those that exist: the ordering tables
// (WithOrdering), the HTTP response table, and
// on Postgres the outbox (with its dead letters) and the kafka offsets
// table. A name "" is the table's default beside t.
func otherTables(ctx context.Context, w io.Writer, d *database, t dialect.Table, httpName, outboxName, offsetsName string) error {
	if f, ok, err := readOrderFigures(ctx, d, t); err != nil {
		return err
	} else if ok {
		printOrderFigures(w, f)
	}
	if httpName == "" {
		httpName = beside(t, t.Name+"_http")
	}
	ht, _ := dialect.ParseTable(httpName) // checked with the flags
	lay, err := d.layout(ctx, ht)
	if err != nil {
		return err
	}
	if lay.exists {
		st, err := idemhttp.TableStats(ctx, d.db, d.target.dialect, idemhttp.Tables{Claims: t.String(), Responses: httpName})
		if err != nil {
			return err
		}
		oldest := "none"
		if !st.Oldest.IsZero() {
			oldest = st.Oldest.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "http responses\t%s: %d stored, oldest %s", httpName, st.Responses, oldest)
		if lay.sizesKnown {
			fmt.Fprintf(w, ", size %s", humanBytes(lay.tableBytes+lay.indexBytes))
		}
		fmt.Fprintln(w, " (cleanup -http-responses deletes those whose claims are gone)")
	}
	if d.target.kind != kindPostgres {
		return nil
	}
	if outboxName == "" {
		outboxName = beside(t, outbox.DefaultTable)
	}
	if offsetsName == "" {
		offsetsName = beside(t, migrations.DefaultKafkaOffsetsTable)
	}
	exists := func(name string) (bool, error) {
		tt, _ := dialect.ParseTable(name)
		var ok bool
		err := d.db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", tt.Quoted(pq.QuoteIdentifier)).Scan(&ok)
		return ok, err
	}
	if ok, err := exists(outboxName); err != nil || !ok {
		if err != nil {
			return err
		}
	} else {
		// An Outbox is one consumer's; its Stats are the whole table's.
		ob, err := outbox.New(d.db, "idempotent-stats", outbox.WithTable(outboxName))
		if err != nil {
			return err
		}
		st, err := ob.Stats(ctx)
		if err != nil {
			return err
		}
		store, err := deadletter.New(d.db, deadletter.WithTable(outboxName))
		if err != nil {
			return err
		}
		var dead int
		for f := (deadletter.Filter{Limit: deadletter.MaxPage}); ; {
			dls, next, err := store.List(ctx, f)
			if err != nil {
				return err
			}
			dead += len(dls)
			if next == 0 {
				break
			}
			f.After = next
		}
		fmt.Fprintf(w, "outbox\t%s: %d pending (%d leased, oldest %s), %d given up; %d dead letters (idempotent dead-letters list)\n",
			outboxName, st.Pending, st.Leased, formatDays(st.OldestPending.Round(time.Second)), st.Dead, dead)
	}
	if ok, err := exists(offsetsName); err != nil || !ok {
		return err
	}
	q, err := kafkaoffsets.New(offsetsName)
	if err != nil {
		return err
	}
	rows, err := kafkaoffsets.List(ctx, d.db, q, "", "")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "kafka offsets\t%s: %d stored offsets (idempotent kafka-offsets list)\n", offsetsName, len(rows))
	return nil
}

// mysqlTableWhere matches a table's rows of information_schema.TABLES or
// PARTITIONS, with mysqlTableArgs.
const mysqlTableWhere = "TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"

func mysqlTableArgs(t dialect.Table) []any {
	var schema any
	if t.Schema != "" {
		schema = t.Schema
	}
	return []any{schema, t.Name}
}

func mysqlLayout(ctx context.Context, db *sql.DB, dl dialect.Dialect, t dialect.Table) (layout, error) {
	lay := layout{partClaims: map[string]int64{}, partBytes: map[string]int64{}, sizesKnown: true}
	var options string
	err := db.QueryRowContext(ctx, "SELECT COALESCE(DATA_LENGTH, 0), COALESCE(INDEX_LENGTH, 0), COALESCE(CREATE_OPTIONS, '') FROM information_schema.TABLES WHERE "+mysqlTableWhere,
		mysqlTableArgs(t)...).Scan(&lay.tableBytes, &lay.indexBytes, &options)
	switch {
	case err == sql.ErrNoRows:
		return lay, nil
	case err != nil:
		return lay, err
	}
	lay.exists = true
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE "+mysqlTableWhere+" AND PARTITION_NAME IS NOT NULL",
		mysqlTableArgs(t)...).Scan(&n); err != nil || n == 0 {
		return lay, err
	}
	lay.partitioned = true
	// The sizes InnoDB reports are estimates, refreshed by ANALYZE TABLE;
	// the counts are exact.
	err = query(ctx, db, "SELECT PARTITION_NAME, COALESCE(DATA_LENGTH, 0) + COALESCE(INDEX_LENGTH, 0) FROM information_schema.PARTITIONS WHERE "+mysqlTableWhere+" AND PARTITION_NAME IS NOT NULL",
		mysqlTableArgs(t), scanInto(lay.partBytes))
	if err != nil {
		return lay, err
	}
	p, _ := dl.(dialect.Partitioner)
	byDay := map[string]int64{}
	if err := query(ctx, db, "SELECT DATE_FORMAT(event_day, '%Y-%m-%d'), COUNT(*) FROM "+t.Quoted(mysqlQuote)+" GROUP BY event_day", nil, scanInto(byDay)); err != nil || p == nil {
		return lay, err
	}
	for day, n := range byDay {
		if d, err := time.Parse(time.DateOnly, day); err == nil {
			lay.partClaims[p.PartitionName(t, d)] = n
		}
	}
	return lay, nil
}

func mysqlQuote(s string) string { return "`" + s + "`" }

// sqliteMaster is the schema table of t's (attached) database.
func sqliteMaster(t dialect.Table) string {
	if t.Schema != "" {
		return `"` + t.Schema + `".sqlite_master`
	}
	return "sqlite_master"
}

func sqliteLayout(ctx context.Context, db *sql.DB, t dialect.Table) (layout, error) {
	var lay layout
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+sqliteMaster(t)+" WHERE type = 'table' AND name = ?", t.Name).Scan(&n); err != nil || n == 0 {
		return lay, err
	}
	lay.exists = true
	schema := t.Schema
	if schema == "" {
		schema = "main"
	}
	// dbstat is compiled into modernc.org/sqlite; a build without it only
	// loses the sizes.
	err := db.QueryRowContext(ctx, `SELECT
  coalesce((SELECT sum(pgsize) FROM dbstat(?1) WHERE name = ?2), 0),
  coalesce((SELECT sum(pgsize) FROM dbstat(?1) WHERE name IN (SELECT name FROM `+sqliteMaster(t)+` WHERE type = 'index' AND tbl_name = ?2)), 0)`,
		schema, t.Name).Scan(&lay.tableBytes, &lay.indexBytes)
	lay.sizesKnown = err == nil
	return lay, nil
}

// scanInto returns a row callback that stores (name, number) rows in m.
func scanInto(m map[string]int64) func(*sql.Rows) error {
	return func(rows *sql.Rows) error {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return err
		}
		m[name] = n
		return nil
	}
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
