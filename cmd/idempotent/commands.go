package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/migrations"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/sqlite"
)

func cmdSchema(_ context.Context, args []string, e env) error {
	c := newCommand("schema", "Prints the claim table's DDL. Needs no database.", e, false)
	partitioned := c.fs.Bool("partitioned", false, "the table partitioned by event day")
	format := c.fs.String("format", "sql", "sql, goose, golang-migrate-up or golang-migrate-down (postgres); sql (mysql, sqlite)")
	offsets := c.fs.String("kafka-offsets", "", "print instead the DDL of the kafka consumer's offsets table of this name (e.g. "+migrations.DefaultKafkaOffsetsTable+"; postgres)")
	db := c.fs.String("dialect", kindPostgres, "postgres, mysql (MySQL and MariaDB) or sqlite")
	if err := c.parse(args); err != nil {
		return err
	}
	switch *db {
	case kindPostgres:
	case kindMySQL, kindSQLite:
		return dialectSchema(c, e, *db, *partitioned, *format, *offsets)
	default:
		return usageError{fmt.Sprintf("-dialect %q: want postgres, mysql or sqlite", *db)}
	}
	// up and goose render the chosen table's DDL.
	up := func() (string, string, error) { return migrations.SQL(c.table, *partitioned) }
	goose := func() (string, error) { return migrations.GooseFile(c.table, *partitioned) }
	if *offsets != "" {
		if *partitioned {
			return usageError{"-kafka-offsets and -partitioned: the offsets table is not partitioned"}
		}
		up = func() (string, string, error) { return migrations.KafkaOffsetsSQL(*offsets) }
		goose = func() (string, error) { return migrations.KafkaOffsetsGooseFile(*offsets) }
	}
	var out string
	var err error
	switch *format {
	case "sql", "golang-migrate-up":
		out, _, err = up()
	case "golang-migrate-down":
		_, out, err = up()
	case "goose":
		out, err = goose()
	default:
		return usageError{fmt.Sprintf("-format %q: want sql, goose, golang-migrate-up or golang-migrate-down", *format)}
	}
	if err != nil {
		return usageError{err.Error()}
	}
	fmt.Fprint(e.stdout, out)
	return nil
}

// dialectSchema prints the statements EnsureSchema runs on MySQL or
// SQLite: the claim table's, then its horizon table's.
func dialectSchema(c *command, e env, kind string, partitioned bool, format, offsets string) error {
	switch {
	case format != "sql":
		return usageError{fmt.Sprintf("-format %q: the %s schema is printed as plain SQL only (-format sql)", format, kind)}
	case offsets != "":
		return usageError{"-kafka-offsets: the kafka consumer's offsets table is Postgres only"}
	}
	t, err := dialect.ParseTable(c.table)
	if err != nil {
		return usageError{err.Error()}
	}
	var d dialect.Dialect = mysql.New()
	if kind == kindSQLite {
		d = sqlite.New()
	}
	stmts := d.SchemaSQL(t)
	if partitioned {
		p, ok := d.(dialect.Partitioner)
		if !ok {
			return usageError{fmt.Sprintf("-partitioned: the %s dialect does not support partitions", kind)}
		}
		stmts = p.PartitionedSchemaSQL(t)
	}
	if h, ok := d.(dialect.HorizonKeeper); ok {
		stmts = append(stmts, h.HorizonSchemaSQL(t)...)
	}
	for _, s := range stmts {
		fmt.Fprintf(e.stdout, "%s;\n", s)
	}
	return nil
}

// claimTable opens the database and returns its claim table, configured by
// opts after the -table flag.
func (c *command) claimTable(ctx context.Context, opts ...idempotent.TableOption) (*database, *idempotent.ClaimTable, error) {
	return c.claimTableFor(ctx, "", opts...)
}

// claimTableFor is claimTable that also checks, before the network is
// touched, consumer's name when it is not "".
func (c *command) claimTableFor(ctx context.Context, consumer string, opts ...idempotent.TableOption) (*database, *idempotent.ClaimTable, error) {
	opts = append([]idempotent.TableOption{idempotent.WithTable(c.table)}, opts...)
	d, err := c.open(c.creates)
	if err != nil {
		return nil, nil, err
	}
	// NewClaimTable sends nothing: the flags are checked before the network
	// is touched.
	t, err := idempotent.NewClaimTable(d.db, d.target.dialect, opts...)
	if err == nil && consumer != "" {
		// New checks a consumer's name as the consumer's own Middleware
		// does, and sends nothing either.
		_, err = idempotent.New(d.db, d.target.dialect, consumer)
	}
	if err != nil {
		_ = d.db.Close()
		return nil, nil, usageError{strings.TrimPrefix(err.Error(), "idempotent: ")}
	}
	if err := d.ping(ctx); err != nil {
		_ = d.db.Close()
		return nil, nil, err
	}
	return d, t, nil
}

func cmdMigrate(ctx context.Context, args []string, e env) error {
	c := newCommand("migrate", "Creates the claim table if it does not exist (partitioned: with the partitions of the\nretention window and the lead days), and an SQLite file if there is none. Drops nothing.", e, true)
	c.creates = true
	partitioned := c.fs.Bool("partitioned", false, "create the table partitioned by event day")
	retention := &days{d: idempotent.DefaultRetention}
	c.fs.Var(retention, "retention", "retention window, for the partitions to create (default 30d)")
	lead := c.fs.Int("lead-days", 7, "partitioned: days to create ahead of today")
	offsets := c.fs.String("kafka-offsets", "", "also create the kafka consumer's offsets table of this name (e.g. "+migrations.DefaultKafkaOffsetsTable+")")
	if err := c.parse(args); err != nil {
		return err
	}
	if err := firstError(checkDuration("retention", retention.d, false), positive("lead-days", *lead, 1)); err != nil {
		return err
	}
	var offsetsUp string
	if *offsets != "" {
		up, _, err := migrations.KafkaOffsetsSQL(*offsets)
		if err != nil {
			return usageError{err.Error()}
		}
		offsetsUp = up
	}
	opts := []idempotent.TableOption{idempotent.WithRetention(retention.d)}
	if *partitioned {
		opts = append(opts, idempotent.WithDailyPartitions(*lead))
	}
	if offsetsUp != "" && c.kindOf() != kindPostgres && c.kindOf() != "" {
		return usageError{"-kafka-offsets: the kafka consumer's offsets table is Postgres only"}
	}
	if *partitioned && c.kindOf() == kindSQLite {
		return usageError{"-partitioned: " + noSQLitePartitions}
	}
	d, t, err := c.claimTable(ctx, opts...)
	if err != nil {
		return err
	}
	defer d.db.Close()
	if err := t.EnsureSchema(ctx); err != nil {
		return d.clean(err)
	}
	if offsetsUp != "" {
		if err := createOffsetsTable(ctx, d, *offsets, offsetsUp); err != nil {
			return d.clean(err)
		}
		fmt.Fprintf(e.stdout, "offsets table %s is ready\n", *offsets)
	}
	if !*partitioned {
		fmt.Fprintf(e.stdout, "claim table %s is ready (plain, with its processed_at index)\n", c.table)
		return nil
	}
	ps, err := t.Partitions(ctx)
	if err != nil {
		return d.clean(err)
	}
	fmt.Fprintf(e.stdout, "claim table %s is ready (partitioned by event day), %d day partitions", c.table, len(ps))
	if len(ps) > 0 {
		fmt.Fprintf(e.stdout, " from %s to %s", ps[0].Day.Format(time.DateOnly), ps[len(ps)-1].Day.Format(time.DateOnly))
	}
	fmt.Fprintln(e.stdout)
	return nil
}

// createOffsetsTable runs the offsets table's DDL in a transaction that
// first takes the advisory lock kafka.EnsureSchema takes, so that it and
// consumers starting at the same time do not race on the catalog.
func createOffsetsTable(ctx context.Context, d *database, name, up string) error {
	t, err := dialect.ParseTable(name)
	if err != nil {
		return err
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create offsets table %s: %w", name, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idempotent/kafka:"+t.String()); err != nil {
		return fmt.Errorf("create offsets table %s: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx, up); err != nil {
		return fmt.Errorf("create offsets table %s: %w", name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create offsets table %s: %w", name, err)
	}
	return nil
}

// noSQLitePartitions says why a partitioned table is refused on SQLite.
const noSQLitePartitions = "the sqlite dialect does not support partitions: day partitions are for Postgres and MySQL/MariaDB (on SQLite, cleanup deletes old claims)"

// requireRetention rejects a destructive command without -retention.
func requireRetention(r *days) error {
	if !r.set {
		return usageError{"-retention is required: the dedup window of every consumer using the table (for example 30d)"}
	}
	return checkDuration("retention", r.d, false)
}

func cmdCleanup(ctx context.Context, args []string, e env) error {
	if ok, err := forEachTenant(ctx, args, e, cmdCleanup); ok {
		return err
	}
	c := newCommand("cleanup", "Deletes claims processed before the retention window (plus the clock-skew margin),\nin batches, each its own short transaction. Only one cleanup runs per table at a time;\na second one stops at once and exits 0 (on SQLite it takes turns with the first).\nOn SQLite give a -pause about as long as a batch takes, or claims wait behind it.", e, true)
	c.fs.String("tenants", "", tenantsHelp)
	retention := &days{}
	c.fs.Var(retention, "retention", "retention window (required), e.g. 30d")
	skew := &days{d: idempotent.DefaultClockSkew}
	c.fs.Var(skew, "skew", "clock-skew margin added to the window (default 5m)")
	consumer := c.fs.String("consumer", "", "only this consumer's claims (default: every consumer of the table)")
	def := idempotent.DefaultCleanupOptions()
	batch := c.fs.Int("batch", def.BatchSize, "claims per batch")
	minBatch := c.fs.Int("min-batch", def.MinBatchSize, "smallest batch when batches time out")
	timeout := c.fs.Duration("statement-timeout", def.StatementTimeout, "time limit of one batch's DELETE")
	pause := c.fs.Duration("pause", 0, "sleep between batches")
	dryRun := c.fs.Bool("dry-run", false, "count the claims that would be deleted, delete nothing")
	httpResponses := c.fs.Bool("http-responses", false, "then delete the stored HTTP responses (idemhttp) whose claims are gone and older than -retention")
	httpTable := c.fs.String("http-table", "", `the HTTP response table, with -http-responses (default: the claim table's name + "_http")`)
	if err := c.parse(args); err != nil {
		return err
	}
	if err := firstError(
		requireRetention(retention), checkDuration("skew", skew.d, true),
		positive("batch", *batch, 1), positive("min-batch", *minBatch, 1),
		checkDuration("statement-timeout", *timeout, false), checkDuration("pause", *pause, true),
	); err != nil {
		return err
	}
	if *minBatch > *batch {
		return usageError{fmt.Sprintf("-min-batch %d is larger than -batch %d", *minBatch, *batch)}
	}
	opts := def
	opts.BatchSize, opts.MinBatchSize, opts.StatementTimeout, opts.Pause = *batch, *minBatch, *timeout, *pause
	opts.DryRun = *dryRun
	who := "every consumer"
	if *consumer != "" {
		who = "consumer " + *consumer
	}
	if err := opts.Validate(); err != nil {
		return usageError{err.Error()}
	}
	if *httpTable != "" && !*httpResponses {
		return usageError{"-http-table without -http-responses: add -http-responses to clean the response table"}
	}
	if *httpTable != "" {
		if _, err := dialect.ParseTable(*httpTable); err != nil {
			return usageError{"-http-table: " + err.Error()}
		}
	}
	if *httpResponses && *dryRun {
		return usageError{"-http-responses and -dry-run: a dry run counts claims only"}
	}
	d, t, err := c.claimTableFor(ctx, *consumer, idempotent.WithRetention(retention.d), idempotent.WithClockSkew(skew.d))
	if err != nil {
		return err
	}
	defer d.db.Close()
	cutoff := time.Now().Add(-retention.d - skew.d).UTC().Truncate(time.Second)
	fmt.Fprintf(e.stdout, "%s: claims of %s processed before %s (retention %s + skew %s)\n",
		c.table, who, cutoff.Format(time.RFC3339), formatDays(retention.d), formatDays(skew.d))
	start := time.Now()
	var batches int
	var longest time.Duration
	opts.Progress = func(p idempotent.CleanupProgress) {
		batches = p.Batch
		longest = max(longest, p.Took)
		if p.TimedOut {
			if e.terminal {
				fmt.Fprint(e.stdout, "\r\033[K")
			}
			fmt.Fprintf(e.stdout, "batch %d of %d claims ran longer than %v; batches are now %d\n", p.Batch, p.BatchSize, opts.StatementTimeout, max(p.BatchSize/2, opts.MinBatchSize))
			return
		}
		if e.terminal {
			rate := float64(p.Total) / max(time.Since(start).Seconds(), 1e-9)
			fmt.Fprintf(e.stdout, "\r\033[Kbatch %d: %d deleted, %.0f claims/s, last batch %d in %v", p.Batch, p.Total, rate, p.Deleted, p.Took.Round(time.Millisecond))
		}
	}
	var n int64
	if *consumer == "" {
		n, err = t.Cleanup(ctx, opts)
	} else {
		n, err = t.CleanupConsumer(ctx, *consumer, opts)
	}
	if e.terminal && !*dryRun && batches > 0 {
		fmt.Fprintln(e.stdout)
	}
	elapsed := time.Since(start)
	switch {
	case errors.Is(err, idempotent.ErrCleanupBusy):
		fmt.Fprintf(e.stdout, "another cleanup of %s is running and will finish the work; deleted %d here\n", c.table, n)
		return nil
	case err != nil:
		if n > 0 {
			fmt.Fprintf(e.stdout, "deleted %d claims before stopping\n", n)
		}
		return d.clean(err)
	case *dryRun:
		fmt.Fprintf(e.stdout, "dry run: %d claims would be deleted\n", n)
		return nil
	}
	fmt.Fprintf(e.stdout, "deleted %d claims in %d batches, %v (%.0f claims/s); longest batch %v\n",
		n, batches, elapsed.Round(time.Millisecond), float64(n)/max(elapsed.Seconds(), 1e-9), longest.Round(time.Millisecond))
	// Cleanup never deletes what ordered consumers keep: say so, with the
	// figures, where there is any.
	ct, _ := dialect.ParseTable(c.table) // checked by claimTableFor
	if f, ok, err := readOrderFigures(ctx, d, ct); err != nil {
		return d.clean(err)
	} else if ok {
		fmt.Fprintf(e.stdout, "kept %s (%d entities) and the %d parked messages and %d skipped sequences of %s: an entity's last sequence decides its next message after its claims are gone\n",
			f.seqName, f.entities, f.parked, f.skipped, f.parkedName)
	}
	if !*httpResponses {
		return nil
	}
	// The responses go after their claims, by the claims' window: one
	// whose claim is still there is kept, whatever its age.
	tables := idemhttp.Tables{Claims: c.table, Responses: *httpTable}
	n, err = idemhttp.CleanupTable(ctx, d.db, d.target.dialect, tables, retention.d, opts.BatchSize)
	if err != nil {
		return d.clean(err)
	}
	fmt.Fprintf(e.stdout, "deleted %d stored HTTP responses whose claims are gone\n", n)
	return nil
}

func cmdPartitions(ctx context.Context, args []string, e env) error {
	if ok, err := forEachTenant(ctx, args, e, cmdPartitions); ok {
		return err
	}
	c := newCommand("partitions", "Maintains a partitioned claim table: creates the days of the retention window and the\nlead days, and detaches then drops the days older than the window (plus the clock-skew\nmargin). Run it daily. With -list it only lists the partitions.", e, true)
	c.fs.String("tenants", "", tenantsHelp)
	retention := &days{}
	c.fs.Var(retention, "retention", "retention window (required unless -list), e.g. 30d")
	skew := &days{d: idempotent.DefaultClockSkew}
	c.fs.Var(skew, "skew", "clock-skew margin added to the window (default 5m)")
	lead := c.fs.Int("lead-days", 7, "days to create ahead of today")
	list := c.fs.Bool("list", false, "list the partitions, change nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	if !*list {
		if err := requireRetention(retention); err != nil {
			return err
		}
	} else if !retention.set {
		retention.d = idempotent.DefaultRetention
	}
	if err := firstError(checkDuration("skew", skew.d, true), positive("lead-days", *lead, 1)); err != nil {
		return err
	}
	if c.kindOf() == kindSQLite {
		return usageError{noSQLitePartitions}
	}
	d, t, err := c.claimTable(ctx, idempotent.WithRetention(retention.d), idempotent.WithClockSkew(skew.d), idempotent.WithDailyPartitions(*lead))
	if err != nil {
		return err
	}
	defer d.db.Close()
	if *list {
		ps, err := t.Partitions(ctx)
		if err != nil {
			return d.clean(err)
		}
		for _, p := range ps {
			state := ""
			if !p.Attached {
				state = "  (detached: dropped by the next run)"
			}
			fmt.Fprintf(e.stdout, "%s  %s%s\n", p.Day.Format(time.DateOnly), p.Name, state)
		}
		fmt.Fprintf(e.stdout, "%d partitions\n", len(ps))
		return nil
	}
	rep, err := t.MaintainPartitions(ctx)
	if errors.Is(err, idempotent.ErrNotPartitioned) {
		return fmt.Errorf("claim table %s is not partitioned: run idempotent cleanup for it instead", c.table)
	}
	for _, p := range rep.Created {
		fmt.Fprintf(e.stdout, "created %s (%s)\n", p.Name, p.Day.Format(time.DateOnly))
	}
	for _, p := range rep.Dropped {
		fmt.Fprintf(e.stdout, "dropped %s (%s)\n", p.Name, p.Day.Format(time.DateOnly))
	}
	if err != nil {
		return d.clean(err)
	}
	fmt.Fprintf(e.stdout, "%s: %d created, %d dropped\n", c.table, len(rep.Created), len(rep.Dropped))
	return nil
}
