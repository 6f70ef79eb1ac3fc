package kafka

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/kafkaoffsets"
	"github.com/txclaim/idempotent/migrations"
)

// DefaultOffsetsTable is the offsets table's name when WithOffsetsTable is
// not given.
const DefaultOffsetsTable = "kafka_offsets"

// SchemaLockTimeout bounds every lock wait of EnsureSchema.
const SchemaLockTimeout = kafkaoffsets.LockTimeout

// SchemaSQL returns the Postgres DDL that creates (up) and drops (down) the
// offsets table named table ("table" or "schema.table"): one row per
// (consumer, topic, partition) holding the offset of the next record to
// apply and the Kafka topic ID it belongs to. It is what EnsureSchema runs,
// what the migration files of package migrations hold and what the CLI's
// "schema -kafka-offsets" prints: it is migrations.KafkaOffsetsSQL.
func SchemaSQL(table string) (up, down string, err error) {
	if _, err := dialect.ParseTable(table); err != nil {
		return "", "", fmt.Errorf("kafka: offsets table: %w", err)
	}
	return migrations.KafkaOffsetsSQL(table)
}

// EnsureSchema creates the offsets table named table (DefaultOffsetsTable
// if empty) in db if it does not exist. It is safe to call from many
// processes at once and on every start: it reads the catalog first and,
// when the table is there, sends no DDL and takes no lock, so it never
// queues a running consumer's transactions behind it. A table that is there
// without the topic_id column (made by an earlier version of this package)
// is an error saying which ALTER TABLE to run. When the table is missing it
// creates it in a transaction whose lock waits — including the advisory
// lock that serialises the processes starting together — are bounded by
// SchemaLockTimeout; when that runs out it gives up, changes nothing, and
// says so. Only Postgres is supported.
func EnsureSchema(ctx context.Context, db *sql.DB, table string) error {
	if db == nil {
		return errors.New("kafka: EnsureSchema: nil *sql.DB")
	}
	if table == "" {
		table = DefaultOffsetsTable
	}
	q, err := kafkaoffsets.New(table)
	if err != nil {
		return err
	}
	return kafkaoffsets.Ensure(ctx, db, q)
}

// storedOffset is a partition's row of the offsets table.
type storedOffset struct {
	next    int64
	topicID string // "" when none is stored
}

// topicIDArg is a topic ID as the offset advance's argument: NULL when the
// fetch reported none.
func topicIDArg(id string) any {
	if id == "" {
		return nil
	}
	return id
}

// formatTopicID prints a Kafka topic ID as Kafka's tools do (URL-safe
// base64 without padding), or "" for the zero ID: a broker that reports no
// topic IDs.
func formatTopicID(id [16]byte) string {
	if id == ([16]byte{}) {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(id[:])
}

// advanceOffset moves the stored offset of topic/partition from expected
// (-1: no row) to next in tx, or returns a *fenceError (rolling tx back is
// the caller's) when the stored offset is elsewhere, or a *LogGapError when
// the stored topic ID is another topic's.
func (c *Consumer) advanceOffset(ctx context.Context, tx *sql.Tx, topic string, partition int32, expected, next int64, topicID string) error {
	stmt, err := c.advanceStmt(ctx)
	if err != nil {
		return fmt.Errorf("kafka: prepare the offset advance: %w", c.q.TableError(err, ErrNoOffsetsTable))
	}
	res, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, c.consumer, topic, partition, next, expected, topicIDArg(topicID))
	if err != nil {
		return fmt.Errorf("kafka: advance offset of %s/%d to %d: %w", topic, partition, next, c.q.TableError(err, ErrNoOffsetsTable))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("kafka: advance offset of %s/%d: rows affected: %w", topic, partition, err)
	}
	if n == 1 {
		return nil
	}
	return c.fenced(ctx, tx, topic, partition, expected, next, topicID)
}

// fenced returns the error of an advance of topic/partition from expected
// to next that wrote nothing, from the row read in tx: a *fenceError when
// the stored offset is elsewhere, a *LogGapError when it is where expected
// but stored for another topic ID (the topic was re-created).
func (c *Consumer) fenced(ctx context.Context, tx *sql.Tx, topic string, partition int32, expected, next int64, topicID string) error {
	stored, storedID := int64(-1), ""
	if err := tx.QueryRowContext(ctx, c.q.Read, c.consumer, topic, partition).Scan(&stored, &storedID); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("kafka: read offset of %s/%d: %w", topic, partition, err)
	}
	if stored == expected && storedID != "" && topicID != "" && storedID != topicID {
		return &LogGapError{Topic: topic, Partition: partition, Stored: stored, LogStart: -1, HighWatermark: -1, First: next - 1, StoredTopicID: storedID, TopicID: topicID}
	}
	return &fenceError{topic: topic, partition: partition, expected: expected, next: next, stored: stored}
}

// loadOffsets reads the stored offsets of topic's partitions.
func (c *Consumer) loadOffsets(ctx context.Context, topic string) (map[int32]storedOffset, error) {
	rows, err := c.db.QueryContext(ctx, c.q.Load, c.consumer, topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: load offsets of %s: %w", topic, c.q.TableError(err, ErrNoOffsetsTable))
	}
	defer rows.Close()
	out := map[int32]storedOffset{}
	for rows.Next() {
		var p int32
		var o storedOffset
		if err := rows.Scan(&p, &o.next, &o.topicID); err != nil {
			return nil, fmt.Errorf("kafka: load offsets of %s: %w", topic, err)
		}
		out[p] = o
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("kafka: load offsets of %s: %w", topic, err)
	}
	return out, nil
}

// advanceStmt returns the offset advance prepared on the Consumer's db: it
// runs on every transaction, and a statement prepared once per connection
// costs one round trip where an unprepared one may cost two.
func (c *Consumer) advanceStmt(ctx context.Context) (*sql.Stmt, error) {
	c.prepMu.Lock()
	defer c.prepMu.Unlock()
	if c.prepared != nil {
		return c.prepared, nil
	}
	// Prepared on the pool, outside the transaction ctx belongs to: a
	// context with ctx's cancellation but none of its values, so that a
	// guarded database (idempotent.GuardConnector), which refuses a
	// statement sent with a handler's context outside its transaction,
	// lets it through.
	pctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	stmt, err := c.db.PrepareContext(pctx, c.q.Advance(1))
	if err != nil {
		return nil, err
	}
	c.prepared = stmt
	return stmt, nil
}
