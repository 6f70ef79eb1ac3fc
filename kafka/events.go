package kafka

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// Dropped is the Detail of an adapter.EventDeadLettered whose poison record
// was dropped rather than dead-lettered: the Consumer has no dead-letter
// outbox (WithDeadLetter), so the record's offset advanced past it and
// nothing else was written. A record that was dead-lettered has the record
// itself as Detail, as every other record event.
type Dropped struct {
	// Record is the poison record.
	Record *kgo.Record
}

// Rebalance is the Detail of an adapter.EventAssigned, EventRevoked or
// EventLost: the partitions the group gave this member, took back, or
// that the member lost.
type Rebalance struct {
	// Partitions are the partitions, by topic, in ascending order.
	Partitions map[string][]int32
	// Offsets holds, for an EventAssigned, the offset stored in the
	// database that each partition is sought to, -1 where none is stored
	// (it then starts at the WithResetPosition position). Nil otherwise.
	Offsets map[string]map[int32]int64
}

// position names a record by its place in the log, "topic/partition/offset":
// an event's Source, a dead letter's outbox key and DeadLetterSourceHeader.
func position(r *kgo.Record) string {
	return partitionSource(r.Topic, r.Partition, r.Offset)
}

// outcome is the Outcome of a record whose claim was new (applied) or not.
func outcome(applied bool) idempotent.Outcome {
	if applied {
		return idempotent.Applied
	}
	return idempotent.Duplicate
}

// eventResult is the result of a record settled with event e, for a Tracer.
func eventResult(e adapter.Event) adapter.Result {
	switch e.Type {
	case adapter.EventApplied:
		return adapter.Result{Outcome: idempotent.Applied}
	case adapter.EventDuplicate:
		return adapter.Result{Outcome: idempotent.Duplicate}
	}
	return adapter.Result{Err: e.Err}
}

func partitionSource(topic string, partition int32, offset int64) string {
	return topic + "/" + strconv.FormatInt(int64(partition), 10) + "/" + strconv.FormatInt(offset, 10)
}

// fetchSource names a partition, "topic/partition", as the Source of an
// event about it that concerns no record (an empty topic: none).
func fetchSource(topic string, partition int32) string {
	if topic == "" {
		return ""
	}
	return topic + "/" + strconv.FormatInt(int64(partition), 10)
}

// delivery returns the event of a record, with its message as far as it
// can be read (a record whose key cannot be read has none), its position
// as Source and itself as Detail; the caller sets the type.
func (c *Consumer) delivery(r *kgo.Record) adapter.Event {
	msg, _ := c.cfg.ac.Message(r)
	return adapter.Event{Message: msg, Source: position(r), Detail: r}
}
