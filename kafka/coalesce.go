package kafka

import (
	"context"
	"database/sql"
	"fmt"

	"sync/atomic"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/adapter"
)

// Coalesced records (NewConsumer with a Middleware created
// idempotent.WithCoalescing).
//
// Each worker applies its partition's records one at a time, in offset
// order, as without coalescing; a record's delivery joins the Middleware's
// coalesced group (adapter.Path.Coalesced) instead of a transaction of its
// own. The records of different partitions that are in flight at the same
// time — one per partition, since a worker waits for its record's outcome
// before it takes the next — share one transaction: their claims in one
// statement, their handlers one after the other, and the offset advances of
// every member of the group, duplicates included, in one more statement
// (advanceAll) before the COMMIT.

// offsetItem is a record's offset advance, the item its delivery gives the
// group's companion.
type offsetItem struct {
	topic     string
	partition int32
	expected  int64 // the stored offset the advance starts from, -1: no row
	next      int64
	topicID   string // "" when the fetch reported none
}

// advanceAllSQL is the offset advance of a coalesced group: Advance for
// every row of the arrays $2 (topics), $3 (partitions), $4 (next offsets),
// $5 (expected stored offsets, -1 for no row), $6 (topic IDs, ” for none)
// of consumer $1, in (topic, partition) order, so that groups lock their
// rows in one order. It returns the (topic, partition) of each row it
// advanced; a row it did not advance is fenced (see Consumer.fenced).
func advanceAllSQL(quoted string) string {
	return `WITH u AS (SELECT * FROM unnest($2::text[], $3::integer[], $4::bigint[], $5::bigint[], $6::text[]) AS u(topic, partition, next_offset, expected, topic_id))
INSERT INTO ` + quoted + ` AS o (consumer, topic, partition, next_offset, topic_id)
SELECT $1, u.topic, u.partition, u.next_offset, nullif(u.topic_id, '') FROM u ORDER BY u.topic, u.partition
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, topic_id = coalesce(EXCLUDED.topic_id, o.topic_id), updated_at = now()
WHERE o.next_offset = (SELECT u.expected FROM u WHERE u.topic = EXCLUDED.topic AND u.partition = EXCLUDED.partition)
AND EXCLUDED.next_offset > o.next_offset AND (o.topic_id IS NULL OR EXCLUDED.topic_id IS NULL OR o.topic_id = EXCLUDED.topic_id)
RETURNING o.topic, o.partition`
}

// applying counts the partitions whose next record may join a coalesced
// group now — the ready count of c.co — so that a group closes as soon as
// every such record has joined it. A round counts its partitions in before
// its workers start (counted counts n of them) and out as they finish
// (each returned function once); a record waiting out its requeue delay is
// counted out while it waits (away).
func (c *Consumer) counted(n, workers int) (finished func()) {
	if c.co == nil || n == 0 {
		return func() {}
	}
	k := int32(min(n, workers))
	c.applying.Add(k)
	var done atomic.Int32
	return func() {
		// While partitions wait for a worker, one that finishes hands its
		// place to the next; only the last k leave the count.
		if int32(n)-done.Add(1) < k {
			c.leave()
		}
	}
}

// away counts a partition out while its record waits out a requeue delay,
// and returns the function that counts it in again.
func (c *Consumer) away() (back func()) {
	if c.co == nil {
		return func() {}
	}
	c.leave()
	return func() { c.applying.Add(1) }
}

// leave counts a partition out and closes an open group that has every
// record left to come.
func (c *Consumer) leave() {
	c.applying.Add(-1)
	c.co.Flush()
}

// newCoalesced returns the Consumer's coalesced deliveries when its
// Middleware was created WithCoalescing, nil otherwise.
func (c *Consumer) newCoalesced() *adapter.Coalesced {
	co, ok := c.path.Coalesced(c.advanceAll, func() int { return int(c.applying.Load()) })
	if !ok {
		return nil
	}
	return co
}

// advanceAll is the companion of a coalesced group: it advances the
// offsets of every item (offsetItem) in one statement, and fails, alone,
// each member whose advance wrote nothing, with its *fenceError or
// *LogGapError.
func (c *Consumer) advanceAll(ctx context.Context, tx *sql.Tx, items []any) ([]error, error) {
	n := len(items)
	topics, ids := make([]string, n), make([]string, n)
	parts, next, expected := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, it := range items {
		o, ok := it.(offsetItem)
		if !ok {
			return nil, fmt.Errorf("kafka: coalesced offset advance: item %d is a %T", i, it)
		}
		topics[i], parts[i], next[i], expected[i], ids[i] = o.topic, int64(o.partition), o.next, o.expected, o.topicID
	}
	args := []any{c.consumer, pq.StringArray(topics), pq.Int64Array(parts), pq.Int64Array(next), pq.Int64Array(expected), pq.StringArray(ids)}
	var rows *sql.Rows
	var err error
	if stmt := c.preparedGroup(); stmt != nil {
		rows, err = tx.StmtContext(ctx, stmt).QueryContext(ctx, args...)
	} else {
		rows, err = tx.QueryContext(ctx, c.groupSQL, args...)
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: advance the offsets of %d partitions: %w", n, c.q.TableError(err, ErrNoOffsetsTable))
	}
	done := make(map[tp]bool, n)
	for rows.Next() {
		var p tp
		if err := rows.Scan(&p.topic, &p.partition); err != nil {
			rows.Close()
			return nil, fmt.Errorf("kafka: advance the offsets of %d partitions: %w", n, err)
		}
		done[p] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("kafka: advance the offsets of %d partitions: %w", n, err)
	}
	if len(done) == n {
		return nil, nil
	}
	failed := make([]error, n)
	for i, it := range items {
		o := it.(offsetItem)
		if !done[tp{o.topic, o.partition}] {
			failed[i] = c.fenced(ctx, tx, o.topic, o.partition, o.expected, o.next, o.topicID)
		}
	}
	return failed, nil
}

// prepareGroup prepares the group's offset advance on the Consumer's db,
// once, before a delivery joins a group (so that preparing does not need a
// second connection while the group's transaction holds one). When it
// cannot, the advance runs unprepared.
func (c *Consumer) prepareGroup(ctx context.Context) {
	c.prepMu.Lock()
	defer c.prepMu.Unlock()
	if c.grouped != nil {
		return
	}
	stmt, err := c.db.PrepareContext(ctx, c.groupSQL)
	if err != nil {
		return // a missing table, say: the statement, unprepared, says which
	}
	c.grouped = stmt
}

func (c *Consumer) preparedGroup() *sql.Stmt {
	c.prepMu.Lock()
	defer c.prepMu.Unlock()
	return c.grouped
}
