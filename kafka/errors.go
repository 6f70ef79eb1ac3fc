package kafka

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
)

// Errors callers branch on; match them with errors.Is.
var (
	// ErrPoison marks an error as poison: fetching the record again would
	// fail the same way, so the consumer dead-letters it (see
	// WithDeadLetter) and moves the partition on. Mark a handler's own
	// errors with [Poison].
	ErrPoison = errors.New("kafka: poison record")

	// ErrUndecodable reports a record value that the decode function of
	// [Decode] (or the JSON parsing of [BodyField]) could not decode. It
	// matches ErrPoison.
	ErrUndecodable = fmt.Errorf("%w: undecodable value", ErrPoison)

	// ErrNoKey reports a record that carries no message key where its
	// KeyFunc looks: a missing or empty header, a missing value field. It
	// matches idempotent.ErrInvalidKey, so the record is poison.
	ErrNoKey = fmt.Errorf("%w: record carries no message key", idempotent.ErrInvalidKey)

	// ErrFenced reports that a partition's stored offset was not where this
	// member expected it when it tried to advance it: another member, which
	// the group gave the partition, advanced it first (or this member's own
	// commit landed although its acknowledgement was lost). The transaction
	// was rolled back — no claim, effect, dead letter or offset of it was
	// written — and the member re-reads the partition from the stored
	// offset if it still owns it. It is reported to the Observer, never
	// returned by Run.
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
	// stops (EventStopped) instead of skipping what it cannot read.
	ErrLogGap = errors.New("kafka: the partition's log does not continue from the stored offset")
)

// Poison marks err as poison, so that the consumer dead-letters the record
// instead of retrying it: return Poison(err) from a handler for a record
// that can never be applied, such as one naming a customer that does not
// exist. The result matches both ErrPoison and err. Poison(nil) is nil.
func Poison(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPoison, err)
}

// IsPoison is the default poison predicate: it reports whether err matches
// ErrPoison, which includes ErrUndecodable and errors marked with Poison. A
// Consumer consults it first, then any predicates added with WithPoison,
// and settles every other error by adapter.Rule.Settle, the rule every
// adapter shares: idempotent.ErrInvalidKey (which includes ErrNoKey), a
// record older than the retention window (idempotent.ErrBeyondRetention)
// and a bad event-time header are poison there too.
func IsPoison(err error) bool {
	return errors.Is(err, ErrPoison)
}

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

// RecordError names the record of a batch that made a BatchHandler fail.
// Return one (built with PoisonRecord) when a set-wise handler finds a
// poison record: the Consumer dead-letters that record and runs the batch
// again without it, instead of falling back to one record at a time.
type RecordError struct {
	// Record is the record, one of the slice given to the BatchHandler.
	Record *kgo.Record
	// Err is what is wrong with it.
	Err error
}

// Error describes the failure.
func (e *RecordError) Error() string {
	return fmt.Sprintf("kafka: record %s/%d@%d: %v", e.Record.Topic, e.Record.Partition, e.Record.Offset, e.Err)
}

// Unwrap returns Err.
func (e *RecordError) Unwrap() error { return e.Err }

// PoisonRecord returns a *RecordError for r that matches ErrPoison and
// err, for a BatchHandler to return when r can never be applied.
func PoisonRecord(r *kgo.Record, err error) error {
	if !IsPoison(err) {
		err = Poison(err)
	}
	return &RecordError{Record: r, Err: err}
}

// LogGapError describes a partition whose log no longer continues from the
// offset stored in the database, as a fetch (or the client) showed it. The
// Consumer stops the partition — it applies nothing more of it and moves
// no offset — and tells the Observer (EventStopped with this error): what
// the stored offset stood for is gone, and only an operator can say where
// to go on. Reset the stored offset deliberately with the CLI
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
