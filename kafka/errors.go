package kafka

import (
	"errors"
	"fmt"
)

// Errors callers branch on; match them with errors.Is.
var (
	// ErrFenced reports that a partition's stored offset was not where this
	// member expected it when it tried to advance it: another member, which
	// the group gave the partition, advanced it first (or this member's own
	// commit landed although its acknowledgement was lost). The transaction
	// was rolled back — no claim, effect, dead letter or offset of it was
	// written — and the member re-reads the partition from the stored
	// offset if it still owns it. It is reported to the Observer
	// (adapter.EventFenced), never returned by Run.
	ErrFenced = errors.New("kafka: partition offset advanced by another owner")

	// ErrClient is returned by Consumer.Run when the Kafka client could
	// not be created, was closed under it, or reported an error that
	// retrying cannot fix (an authorization failure, say). The error wraps
	// the client's.
	ErrClient = errors.New("kafka: client failed")

	// ErrNoOffsetsTable reports that the offsets table does not exist. Run
	// EnsureSchema, or the migration, first.
	ErrNoOffsetsTable = errors.New("kafka: offsets table does not exist")

	// ErrLogGap reports that a partition's log no longer continues from
	// the offset stored in the database: records at or after it were
	// deleted before they were applied, or the log moved backwards under
	// it (the topic was deleted and re-created, or an unclean leader
	// election truncated it). The errors are *LogGapError; the partition
	// stops (adapter.EventStopped) instead of skipping what it cannot
	// read.
	ErrLogGap = errors.New("kafka: the partition's log does not continue from the stored offset")
)

// fenceError is returned from inside a transaction whose offset advance
// found the stored offset elsewhere; it rolls the transaction back.
type fenceError struct {
	topic     string
	partition int32
	expected  int64 // -1: no stored offset
	next      int64
	stored    int64 // what the database holds now, -1 if nothing
}

func (e *fenceError) Error() string {
	return fmt.Sprintf("%v: %s/%d: expected the stored offset at %d to advance it to %d, found %d",
		ErrFenced, e.topic, e.partition, e.expected, e.next, e.stored)
}

func (e *fenceError) Unwrap() error { return ErrFenced }

// LogGapError describes a partition whose log no longer continues from the
// offset stored in the database, as a fetch (or the client) showed it. The
// Consumer stops the partition — it applies nothing more of it and moves
// no offset — and tells the Observer (adapter.EventStopped with this
// error): what the stored offset stood for is gone, and only an operator
// can say where to go on. Reset the stored offset deliberately with the CLI
// ("idempotent kafka-offsets reset"), then restart the member. It matches
// ErrLogGap.
type LogGapError struct {
	// Topic and Partition name the partition.
	Topic     string
	Partition int32
	// Stored is the offset stored in the database: the next record to
	// apply.
	Stored int64
	// LogStart and HighWatermark are the partition's log start offset and
	// high watermark as the fetch reported them; -1 when it did not.
	LogStart, HighWatermark int64
	// First is the offset of the first record fetched; -1 when none was.
	First int64
	// StoredTopicID is the Kafka topic ID stored with the offset, TopicID
	// the one the fetch reported; "" when unknown.
	StoredTopicID, TopicID string
	// Err is the client's own report, when the client found the loss
	// (kgo's *ErrDataLoss, or an OFFSET_OUT_OF_RANGE it does not recover
	// from on its own here); nil otherwise.
	Err error
}

// Error says what was found, with the offsets.
func (e *LogGapError) Error() string {
	where := fmt.Sprintf("kafka: topic %q partition %d: stored offset %d: ", e.Topic, e.Partition, e.Stored)
	var what string
	switch {
	case e.StoredTopicID != "" && e.TopicID != "" && e.StoredTopicID != e.TopicID:
		what = fmt.Sprintf("the topic was deleted and re-created (its topic ID is %s, the stored offset was written for %s)", e.TopicID, e.StoredTopicID)
	case e.LogStart > e.Stored:
		what = fmt.Sprintf("the log starts at %d: records %d to %d were deleted before they were applied", e.LogStart, e.Stored, e.LogStart-1)
	case e.HighWatermark >= 0 && e.HighWatermark < e.Stored:
		what = fmt.Sprintf("the log ends at %d: it moved backwards (the topic was re-created, or an unclean leader election truncated it)", e.HighWatermark)
	case e.First >= 0 && e.First < e.Stored:
		what = fmt.Sprintf("the first record fetched is at %d: the log moved backwards", e.First)
	case e.Err != nil:
		what = fmt.Sprintf("the client reports lost records: %v", e.Err)
	default:
		what = "the log does not continue from it"
	}
	return where + what + "; the partition is stopped: reset its stored offset deliberately (idempotent kafka-offsets reset), then restart the member"
}

// Unwrap returns ErrLogGap and, when the client found the loss, its error.
func (e *LogGapError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrLogGap}
	}
	return []error{ErrLogGap, e.Err}
}
