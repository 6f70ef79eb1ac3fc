package kafka

import (
	"context"
	"fmt"
	"time"
)

// EventType says what an Event reports.
type EventType int

const (
	// EventApplied: a record's claim was new; its effect and its offset
	// advance committed together.
	EventApplied EventType = iota + 1
	// EventDuplicate: a record's claim existed (a producer re-sent it, or it
	// was applied before a crash); its offset advance committed alone.
	EventDuplicate
	// EventDeadLettered: a poison record was written to the dead-letter
	// outbox in the transaction that advanced its offset.
	EventDeadLettered
	// EventDropped: a poison record's offset was advanced and nothing else
	// written, because no dead-letter outbox is configured.
	EventDropped
	// EventRetry: a record (or a batch) failed with an error that is not
	// poison; it will be tried again in place after Delay.
	EventRetry
	// EventFenced: the offset advance found the stored offset elsewhere
	// (see ErrFenced); the transaction rolled back and the partition is read
	// again from the stored offset, if this member still owns it.
	EventFenced
	// EventAbandoned: a partition's remaining records of one poll were not
	// applied because a rebalance or the shutdown was waiting; nothing of
	// them was written, and whoever owns the partition next reads them from
	// the stored offset.
	EventAbandoned
	// EventAssigned: the group assigned Partitions; Offsets holds the
	// stored offsets the member seeks them to (-1 where none is stored).
	EventAssigned
	// EventRevoked: the group revoked Partitions (in a rebalance or when
	// leaving).
	EventRevoked
	// EventLost: Partitions were lost (the member was fenced out of the
	// group, or a fatal group error).
	EventLost
	// EventCommitFailed: the asynchronous commit of offsets to Kafka, made
	// for lag tools only, failed. Nothing is lost: the database's offsets
	// are the ones the consumer seeks to.
	EventCommitFailed
	// EventFetchError: the client reported an error while fetching, which
	// it retries.
	EventFetchError
	// EventStopped: the partition was stopped: this member applies nothing
	// more of it, moves none of its offsets, and no longer fetches it,
	// until it is assigned again (a restart of the member, or a rebalance
	// that takes the partition away and back). Err says why:
	// a *LogGapError (matching ErrLogGap) when its log no longer continues
	// from the stored offset — Offset is then the stored offset; or an
	// error matching idempotent.ErrAutocommit when a handler ended the
	// record's transaction itself (the claim and the offset advance may
	// have committed without the whole effect: repair it by hand) — Offset
	// is then the record's.
	EventStopped
)

// String returns the type's name, such as "applied".
func (t EventType) String() string {
	switch t {
	case EventApplied:
		return "applied"
	case EventDuplicate:
		return "duplicate"
	case EventDeadLettered:
		return "dead-lettered"
	case EventDropped:
		return "dropped"
	case EventRetry:
		return "retry"
	case EventFenced:
		return "fenced"
	case EventAbandoned:
		return "abandoned"
	case EventAssigned:
		return "assigned"
	case EventRevoked:
		return "revoked"
	case EventLost:
		return "lost"
	case EventCommitFailed:
		return "commit-failed"
	case EventFetchError:
		return "fetch-error"
	case EventStopped:
		return "stopped"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event describes something a Consumer did. Fields that do not apply to the
// event's Type are zero.
type Event struct {
	// Type says what happened.
	Type EventType
	// Topic and Partition name the partition of a record event.
	Topic     string
	Partition int32
	// Offset is the record's offset; for EventRetry, EventFenced and
	// EventAbandoned, that of the first record concerned.
	Offset int64
	// Key is the record's message key, when it has one.
	Key string
	// Lag is, for record events, how many records of the partition remain
	// after this one, by the high watermark of the fetch that brought it
	// (-1 when unknown).
	Lag int64
	// Attempt and Delay describe an EventRetry: the failed attempt's number
	// (1 for the first) and the wait before the next.
	Attempt int
	Delay   time.Duration
	// Partitions and Offsets describe a rebalance event.
	Partitions map[string][]int32
	Offsets    map[string]map[int32]int64
	// Err is the error of an EventDeadLettered, EventDropped, EventRetry,
	// EventFenced, EventCommitFailed, EventFetchError or EventStopped.
	Err error
}

// An Observer is told of every record's outcome, retry, fence and
// rebalance, synchronously, on the goroutine that did it. Its method must be
// safe for concurrent use and return quickly.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Stats counts what a Consumer did, over all its Runs.
type Stats struct {
	// Applied, Duplicates, DeadLettered and Dropped count records by
	// outcome; each record a Consumer finished is in exactly one.
	Applied, Duplicates, DeadLettered, Dropped int64
	// Retries counts failed attempts that were retried in place.
	Retries int64
	// Fenced counts offset advances that found the stored offset elsewhere.
	Fenced int64
	// Rebalances counts assignments received.
	Rebalances int64
	// Stopped counts partitions stopped (EventStopped).
	Stopped int64
}
