package kafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/migrations"
)

// DefaultOffsetsTable is the offsets table's name when WithOffsetsTable is
// not given.
const DefaultOffsetsTable = "kafka_offsets"

// offsetStatements are the offsets table's statements for one table, built
// once. Only Postgres is spoken.
type offsetStatements struct {
	table   dialect.Table
	advance string
	read    string
	load    string
}

func newOffsetStatements(name string) (offsetStatements, error) {
	t, err := dialect.ParseTable(name)
	if err != nil {
		return offsetStatements{}, fmt.Errorf("kafka: offsets table: %w", err)
	}
	q := t.Quoted(pgQuote)
	return offsetStatements{
		table:   t,
		advance: advanceSQL(q, 1),
		read:    `SELECT next_offset FROM ` + q + ` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		load:    `SELECT partition, next_offset FROM ` + q + ` WHERE consumer = $1 AND topic = $2`,
	}, nil
}

// advanceSQL is the forward-only, compare-and-set advance of the offsets
// table q, its five parameters numbered from first: consumer, topic,
// partition, the next offset, and the stored offset expected. It writes only
// when the stored offset is the one this member read (-1 for "no row"), and
// only forward: it affects one row when it advanced, none otherwise. An
// UPDATE that waited for another owner's transaction re-checks the row that
// one committed.
func advanceSQL(q string, first int) string {
	p := func(i int) string { return "$" + strconv.Itoa(first+i) }
	return `INSERT INTO ` + q + ` AS o (consumer, topic, partition, next_offset) VALUES (` + p(0) + `, ` + p(1) + `, ` + p(2) + `, ` + p(3) + `)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()
WHERE o.next_offset = ` + p(4) + ` AND EXCLUDED.next_offset > o.next_offset`
}

// SchemaSQL returns the Postgres DDL that creates (up) and drops (down) the
// offsets table named table ("table" or "schema.table"): one row per
// (consumer, topic, partition) holding the offset of the next record to
// apply. It is what EnsureSchema runs, what the migration files of package
// migrations hold and what the CLI's "schema -kafka-offsets" prints: it is
// migrations.KafkaOffsetsSQL.
func SchemaSQL(table string) (up, down string, err error) {
	if _, err := dialect.ParseTable(table); err != nil {
		return "", "", fmt.Errorf("kafka: offsets table: %w", err)
	}
	return migrations.KafkaOffsetsSQL(table)
}

// EnsureSchema creates the offsets table named table (DefaultOffsetsTable
// if empty) in db if it does not exist. It is safe to call from many
// processes at once and on every start. Only Postgres is supported.
func EnsureSchema(ctx context.Context, db *sql.DB, table string) error {
	if db == nil {
		return errors.New("kafka: EnsureSchema: nil *sql.DB")
	}
	if table == "" {
		table = DefaultOffsetsTable
	}
	up, _, err := SchemaSQL(table)
	if err != nil {
		return err
	}
	t, _ := dialect.ParseTable(table)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("kafka: ensure schema of %s: %w", t, err)
	}
	defer func() { _ = tx.Rollback() }()
	// CREATE TABLE IF NOT EXISTS races with itself on the catalog's unique
	// index: serialise the processes that start together.
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idempotent/kafka:"+t.String()); err != nil {
		return fmt.Errorf("kafka: ensure schema of %s: %w", t, err)
	}
	if _, err := tx.ExecContext(ctx, strings.TrimSpace(up)); err != nil {
		return fmt.Errorf("kafka: ensure schema of %s: %w", t, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("kafka: ensure schema of %s: %w", t, err)
	}
	return nil
}

// tableError adds ErrNoOffsetsTable to an error saying the table is missing.
func (q *offsetStatements) tableError(err error) error {
	var se interface{ SQLState() string }
	if errors.As(err, &se) && se.SQLState() == "42P01" {
		return fmt.Errorf("%w: %s: %w", ErrNoOffsetsTable, q.table, err)
	}
	return err
}

// advanceOffset moves the stored offset of topic/partition from expected
// (-1: no row) to next in tx, or returns a *fenceError (rolling tx back is
// the caller's) when the stored offset is elsewhere.
func (c *Consumer) advanceOffset(ctx context.Context, tx *sql.Tx, topic string, partition int32, expected, next int64) error {
	stmt, err := c.advanceStmt(ctx)
	if err != nil {
		return fmt.Errorf("kafka: prepare the offset advance: %w", c.q.tableError(err))
	}
	res, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, c.consumer, topic, partition, next, expected)
	if err != nil {
		return fmt.Errorf("kafka: advance offset of %s/%d to %d: %w", topic, partition, next, c.q.tableError(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("kafka: advance offset of %s/%d: rows affected: %w", topic, partition, err)
	}
	if n == 1 {
		return nil
	}
	return c.fenced(ctx, tx, topic, partition, expected, next)
}

// fenced returns the *fenceError of an advance of topic/partition from
// expected to next that found the stored offset elsewhere, with the stored
// offset read in tx.
func (c *Consumer) fenced(ctx context.Context, tx *sql.Tx, topic string, partition int32, expected, next int64) error {
	stored := int64(-1)
	if err := tx.QueryRowContext(ctx, c.q.read, c.consumer, topic, partition).Scan(&stored); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("kafka: read offset of %s/%d: %w", topic, partition, err)
	}
	return &fenceError{topic: topic, partition: partition, expected: expected, next: next, stored: stored}
}

// loadOffsets reads the stored offsets of topic's partitions.
func (c *Consumer) loadOffsets(ctx context.Context, topic string) (map[int32]int64, error) {
	rows, err := c.db.QueryContext(ctx, c.q.load, c.consumer, topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: load offsets of %s: %w", topic, c.q.tableError(err))
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			return nil, fmt.Errorf("kafka: load offsets of %s: %w", topic, err)
		}
		out[p] = o
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("kafka: load offsets of %s: %w", topic, err)
	}
	return out, nil
}

// pgQuote quotes an identifier ParseTable accepted (letters, digits and
// underscores only, so nothing needs escaping).
func pgQuote(s string) string { return `"` + s + `"` }

// advanceStmt returns the offset advance prepared on the Consumer's db: it
// runs on every transaction, and a statement prepared once per connection
// costs one round trip where an unprepared one may cost two.
func (c *Consumer) advanceStmt(ctx context.Context) (*sql.Stmt, error) {
	c.prepMu.Lock()
	defer c.prepMu.Unlock()
	if c.prepared != nil {
		return c.prepared, nil
	}
	stmt, err := c.db.PrepareContext(ctx, c.q.advance)
	if err != nil {
		return nil, err
	}
	c.prepared = stmt
	return stmt, nil
}
