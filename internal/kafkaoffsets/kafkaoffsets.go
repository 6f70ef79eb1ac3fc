// Package kafkaoffsets holds the statements of the offsets table of the
// github.com/txclaim/idempotent/kafka consumer, and the operations on it
// that the consumer and the idempotent CLI share: creating it without
// blocking anyone, listing its rows and resetting one deliberately. It
// speaks Postgres only, as the table is Postgres only; its DDL is
// migrations.KafkaOffsetsSQL.
package kafkaoffsets

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/migrations"
)

// LockTimeout bounds every lock wait of Ensure: the DDL gives up rather
// than queue the claims of a running consumer behind it.
const LockTimeout = 2 * time.Second

// MaxTopicBytes is the longest topic name Kafka allows.
const MaxTopicBytes = 249

// Statements are one offsets table's statements, built once.
type Statements struct {
	// Table is the table's name as given.
	Table dialect.Table
	// Quoted is its quoted name.
	Quoted string
	// Read reads the stored offset and topic ID of (consumer $1, topic $2,
	// partition $3).
	Read string
	// Load reads partition, stored offset and topic ID of every partition
	// of (consumer $1, topic $2).
	Load string
	// Reset sets the stored offset of (consumer $1, topic $2, partition
	// $3) to $4, creating the row if needed, and forgets its topic ID.
	Reset string
	// List reads every row, or those of consumer $1 and topic $2 where they
	// are not empty, in key order.
	List string
	// Catalog reports whether the table exists and whether it has every
	// column the consumer writes.
	Catalog string
}

// New returns the statements of the offsets table name ("table" or
// "schema.table").
func New(name string) (Statements, error) {
	t, err := dialect.ParseTable(name)
	if err != nil {
		return Statements{}, fmt.Errorf("kafka: offsets table: %w", err)
	}
	q := t.Quoted(quote)
	return Statements{
		Table:  t,
		Quoted: q,
		Read:   `SELECT next_offset, coalesce(topic_id, '') FROM ` + q + ` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		Load:   `SELECT partition, next_offset, coalesce(topic_id, '') FROM ` + q + ` WHERE consumer = $1 AND topic = $2`,
		Reset: `INSERT INTO ` + q + ` AS o (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, topic_id = NULL, updated_at = now()`,
		List: `SELECT consumer, topic, partition, next_offset, coalesce(topic_id, ''), updated_at FROM ` + q + `
WHERE ($1 = '' OR consumer = $1) AND ($2 = '' OR topic = $2) ORDER BY consumer, topic, partition`,
		Catalog: `SELECT c.oid IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'topic_id' AND NOT a.attisdropped)
FROM (SELECT to_regclass($1) AS oid) c`,
	}, nil
}

// Advance is the forward-only, compare-and-set advance of the offsets
// table, its six parameters numbered from first: consumer, topic,
// partition, the next offset, the stored offset expected, and the topic ID
// the fetch reported (NULL when it reported none). It writes only when the
// stored offset is the one the member read (-1 for "no row"), only forward,
// and only for the topic ID already stored, if any: it affects one row when
// it advanced, none otherwise. It keeps a stored topic ID when the fetch
// reported none. An UPDATE that waited for another owner's transaction
// re-checks the row that one committed.
func (s Statements) Advance(first int) string {
	p := func(i int) string { return "$" + strconv.Itoa(first+i) }
	return `INSERT INTO ` + s.Quoted + ` AS o (consumer, topic, partition, next_offset, topic_id) VALUES (` + p(0) + `, ` + p(1) + `, ` + p(2) + `, ` + p(3) + `, ` + p(5) + `)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, topic_id = coalesce(EXCLUDED.topic_id, o.topic_id), updated_at = now()
WHERE o.next_offset = ` + p(4) + ` AND EXCLUDED.next_offset > o.next_offset AND (o.topic_id IS NULL OR EXCLUDED.topic_id IS NULL OR o.topic_id = EXCLUDED.topic_id)`
}

// quote quotes an identifier ParseTable accepted (letters, digits and
// underscores only, so nothing needs escaping).
func quote(s string) string { return `"` + s + `"` }

// TableError adds noTable to an error saying the table is missing.
func (s Statements) TableError(err, noTable error) error {
	if sqlState(err) == "42P01" {
		return fmt.Errorf("%w: %s: %w", noTable, s.Table, err)
	}
	return err
}

func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// Ensure creates the offsets table if it does not exist. It reads the
// catalog first and sends no DDL, and takes no lock, when the table is
// there; a table there without the topic_id column (created before it
// existed) is an error that says what to run. Otherwise it creates the
// table in a transaction whose lock waits are bounded by LockTimeout —
// serialised with the other processes starting at the same time by an
// advisory lock, under the same bound — and says so when it gives up.
func Ensure(ctx context.Context, db *sql.DB, s Statements) error {
	up, _, err := migrations.KafkaOffsetsSQL(s.Table.String())
	if err != nil {
		return err
	}
	fail := func(err error) error { return fmt.Errorf("kafka: ensure schema of %s: %w", s.Table, err) }
	if done, err := s.present(ctx, db); err != nil || done {
		if err != nil {
			return fail(err)
		}
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = `+strconv.FormatInt(LockTimeout.Milliseconds(), 10)); err != nil {
		return fail(err)
	}
	// CREATE TABLE IF NOT EXISTS races with itself on the catalog's unique
	// index: serialise the processes that start together, then look again.
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idempotent/kafka:"+s.Table.String()); err != nil {
		return fail(lockError(err))
	}
	if done, err := s.present(ctx, tx); err != nil || done {
		if err != nil {
			return fail(err)
		}
		return nil
	}
	if _, err := tx.ExecContext(ctx, strings.TrimSpace(up)); err != nil {
		return fail(lockError(err))
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return nil
}

// lockError says that a statement gave up waiting for a lock.
func lockError(err error) error {
	if sqlState(err) == "55P03" {
		return fmt.Errorf("gave up after waiting %v for a lock (another transaction holds it; nothing was changed, try again): %w", LockTimeout, err)
	}
	return err
}

// present reports whether the table exists with every column, from the
// catalog alone.
func (s Statements) present(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (bool, error) {
	var exists, complete bool
	if err := q.QueryRowContext(ctx, s.Catalog, s.Quoted).Scan(&exists, &complete); err != nil {
		return false, fmt.Errorf("read the catalog: %w", err)
	}
	if exists && !complete {
		return false, fmt.Errorf("the table has no topic_id column (it was created by an earlier version): run ALTER TABLE %s ADD COLUMN topic_id text", s.Quoted)
	}
	return exists, nil
}

// Row is one row of the offsets table.
type Row struct {
	Consumer   string
	Topic      string
	Partition  int32
	NextOffset int64
	TopicID    string // "" when none is stored
	UpdatedAt  time.Time
}

// List returns the rows of consumer and topic ("" for every one), in key
// order.
func List(ctx context.Context, db *sql.DB, s Statements, consumer, topic string) ([]Row, error) {
	rows, err := db.QueryContext(ctx, s.List, consumer, topic)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s.Table, err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.Consumer, &r.Topic, &r.Partition, &r.NextOffset, &r.TopicID, &r.UpdatedAt); err != nil {
			return nil, fmt.Errorf("list %s: %w", s.Table, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list %s: %w", s.Table, err)
	}
	return out, nil
}

// Reset sets the stored offset of consumer's partition of topic to offset,
// creating the row if there is none, and forgets its topic ID (the next
// advance stores the topic's current one). It returns the row as it was,
// and false when there was none. It checks its arguments before anything
// is sent.
func Reset(ctx context.Context, db *sql.DB, s Statements, consumer, topic string, partition int32, offset int64) (Row, bool, error) {
	switch {
	case consumer == "":
		return Row{}, false, errors.New("reset: empty consumer")
	case topic == "" || len(topic) > MaxTopicBytes:
		return Row{}, false, fmt.Errorf("reset: topic %q, want 1 to %d bytes", topic, MaxTopicBytes)
	case partition < 0:
		return Row{}, false, fmt.Errorf("reset: partition %d, want 0 or more", partition)
	case offset < 0:
		return Row{}, false, fmt.Errorf("reset: offset %d, want 0 or more", offset)
	}
	fail := func(err error) (Row, bool, error) {
		return Row{}, false, fmt.Errorf("reset %s/%d of consumer %q in %s: %w", topic, partition, consumer, s.Table, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = tx.Rollback() }()
	was := Row{Consumer: consumer, Topic: topic, Partition: partition}
	existed := true
	err = tx.QueryRowContext(ctx, s.Read+` FOR UPDATE`, consumer, topic, partition).Scan(&was.NextOffset, &was.TopicID)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		existed = false
	case err != nil:
		return fail(err)
	}
	if _, err := tx.ExecContext(ctx, s.Reset, consumer, topic, partition, offset); err != nil {
		return fail(err)
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return was, existed, nil
}
