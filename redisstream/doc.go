// Package redisstream consumes a Redis stream (through
// github.com/redis/go-redis/v9) as one consumer of a consumer group and
// applies each entry's database effect exactly once with an
// [idempotent.Middleware], acknowledging late: an entry is acknowledged
// (XACK) only after its transaction has committed, for a new claim and a
// duplicate alike.
//
// A consumer group delivers each entry to one consumer and keeps it in the
// group's pending entries list until it is acknowledged. An entry whose
// XACK was lost, or whose consumer died after its commit, is delivered
// again — re-claimed from the dead consumer — and a producer that retried
// an XADD added the same message twice, under two ids. The claim makes
// every such delivery a Duplicate.
//
// The package has the shape every broker adapter of this module has
// (docs/adapters.md): a [Handler] or [BatchHandler] that runs only for a
// new claim, in the claim's transaction; [NewConsumer] and
// [NewBatchConsumer]; the key functions; the options of package adapter's
// Config; an [adapter.Observer] told of every settlement; and
// [adapter.Rule.Settle], the one settle rule.
//
// # Quickstart
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	mw, _ := idempotent.New(db, postgres.New(), "loyalty")
//	_ = mw.EnsureSchema(ctx)
//	c, _ := redisstream.NewConsumer(mw, redisstream.Decode(redisstream.JSON[OrderCompleted], credit))
//	err := c.Run(ctx, rdb, "orders", "loyalty") // nil after a graceful shutdown
//
// Run creates the group, from the stream's first entry, when it does not
// exist. A producer adds each message as an entry of three fields:
//
//	XADD orders * idempotency_key order-completed:9912 \
//	    Idempotent-Event-Time 2026-12-01T09:30:00Z payload '{"order_id":9912,…}'
//
// the key in [DefaultKeyField] (the default key, [Field]), the event time
// in [adapter.EventTimeHeader] (written by [adapter.FormatEventTime]), the
// payload in [PayloadField] (what [Decode] and [BodyField] read). The
// outbox [Sender] writes exactly these. The Middleware's consumer name
// keeps the claims of one group apart from another's: name it after the
// group.
//
// # Settling
//
// A [Consumer] handles entries with a fixed number of workers
// ([WithWorkers]) and settles every delivery as [adapter.Rule.Settle]
// decides:
//
//   - Ack, the claim was new and the effect committed, or the claim
//     existed: XACK ([adapter.EventApplied], [adapter.EventDuplicate]);
//   - Requeue — a failure a redelivery may fix (the handler's own errors,
//     the transaction's retryable failures past the Middleware's retry
//     policy, a missing partition, an entry dated a little in the future):
//     no XACK. The entry stays pending to the consumer, which reads it
//     again (XCLAIM to itself, one more delivery) after the rule's delay,
//     idempotent.RetryPolicy.Backoff of the delivery count
//     ([WithRetryDelay]) ([adapter.EventRequeued], with the delay);
//   - DeadLetter — a poison entry: no key ([adapter.ErrNoKey]), an event
//     time older than the retention window ([idempotent.ErrBeyondRetention])
//     or not RFC 3339 ([adapter.ErrBadEventTime]), an undecodable payload
//     ([adapter.ErrUndecodable]), an error marked with [adapter.Poison] or
//     recognised by [WithPoison], a handler that left the claim's
//     transaction ([idempotent.ErrAutocommit]), or more deliveries than
//     [WithMaxDeliveries] allows ([ErrMaxDeliveries]): written to the
//     dead-letter outbox in a transaction ([WithDeadLetter]), then XACK
//     (package deadletter lists, replays and discards those rows: a Relay
//     with [ReplaySender] adds a replay back to its source stream);
//     without a dead-letter outbox, XACK alone: the entry is dropped, and
//     the event's Detail is a [Dropped] ([adapter.EventDeadLettered], with
//     the error).
//
// Exactly one of those events is reported per delivery, with the
// [*Delivery] as Detail (its stream, id, fields and delivery count, which
// is also [adapter.Event].Attempt). An XACK that fails is reported as
// [adapter.EventSettleFailed] too, after the settlement's own event: the
// entry stays pending, is re-claimed after the claim idle bound, and the
// claim makes it a duplicate.
//
// # Pending entries, idle time and delivery counts
//
// What a consumer has read and not acknowledged is pending to it. A
// running Consumer touches everything pending to it — in flight, waiting
// in its queue, waiting for a requeue delay — every third of the claim
// idle bound ([WithClaimIdle], default [DefaultClaimIdle]) with
// XCLAIM … JUSTID, which resets an entry's idle time without counting a
// delivery, so no other consumer takes them however long a handler or a
// delay runs. Every quarter of the bound (at least every five seconds) it
// runs XAUTOCLAIM for the group's entries idle longer than the bound:
// those of consumers that died or were stopped, and its own left behind by
// an XACK that failed. Each re-claim counts a delivery; the Consumer reads
// the count with XPENDING.
//
// Choose the claim idle bound longer than the longest pause a live
// consumer may take between two touches — a garbage-collection pause, a
// Redis failover — and as short as the delay you accept before a dead
// consumer's entries are delivered again: a minute is a fair default;
// seconds suit a test. A bound too short costs nothing in correctness: an
// entry re-claimed from a consumer that was only slow is a duplicate
// (or, while the first transaction holds the claim, requeued with
// idempotent.ErrClaimBusy).
//
// The delivery count bounds poison that crashes its consumer: each crash
// leaves the entry to be re-claimed, one delivery more, and
// [WithMaxDeliveries] dead-letters it once the count passes the bound,
// without running the handler again. It also bounds requeues: a failure
// on the last allowed delivery dead-letters instead of requeueing. Size it
// with the retry delays: n deliveries span about the sum of the first n-1
// backoffs. Without it an entry is requeued for as long as it fails.
//
// # Trimming
//
// A stream capped with MAXLEN or MINID (XADD … MAXLEN ~ n, XTRIM) drops
// its oldest entries whether or not a group has acknowledged them. An
// entry trimmed while pending keeps its id in the pending list, but its
// fields are gone: XCLAIM and XAUTOCLAIM remove it from the list instead
// of delivering it, so the Consumer never reads it again. A trimmed entry
// that had been requeued, or was pending to a consumer that died, is lost
// — its effect is never applied, and no event reports it (its last
// delivery's event was EventRequeued, or none). Trim only what every
// group has acknowledged: by MINID below the oldest pending id of every
// group (XPENDING, XINFO GROUPS), or with a MAXLEN far above the backlog
// any group may build up. An acknowledged entry trimmed later costs
// nothing: its claim stays in the claim table.
//
// # Shutdown
//
// When Run's context ends it reads nothing more, lets the in-flight
// entries finish — with a context that is not cancelled, for up to
// [WithShutdownTimeout] — and acknowledges them; entries it read but had
// not begun are left pending ([adapter.EventReleased]), as are those
// waiting for a requeue delay, for the group's next consumer to re-claim
// after the claim idle bound. A closed client ends Run with
// [ErrClientClosed]; a deleted group or stream with [ErrNoGroup].
//
// # Batches
//
// A batch Consumer ([NewBatchConsumer]) reads up to [WithBatchSize]
// entries with one XREADGROUP, claims them in one transaction with
// Middleware.ProcessMessages and hands the fresh ones to its
// [BatchHandler]; each entry is then settled on its own, and the XACKs of
// a batch go out in one pipeline. An entry the handler names with
// adapter.PoisonItem is dead-lettered alone and the rest run again
// without it.
//
// # Ordered per key
//
// With a Middleware created idempotent.WithOrdering, an entry that carries
// an ordering key and a sequence (the fields adapter.OrderKeyHeader and
// adapter.OrderSeqHeader, which the Sender writes for a call enqueued with
// outbox.WithOrder) applies in its entity's sequence order, checked in the
// database (docs/ordering.md), per message and in batches. A per-message
// Consumer of several workers hands each entry to the worker given by a
// hash of its ordering key (adapter.Config.Route), so that one entity's
// entries run one after another in the order they were read and need not
// park, while other entities run on the other workers. An entry that
// arrives before its predecessor (a re-claimed or requeued one, another
// consumer's) is parked in the database with every field, its payload as
// the parked payload, and acknowledged (XACK after the commit); when its
// predecessor applies it applies in the same transaction through the
// Ordering's Release, which rebuilds the entry with [ParkedDelivery]. A
// batch Consumer's batches are ordered by Middleware.ProcessMessages.
//
// # Sending
//
// [NewSender] returns an outbox.Sender that adds each outbox call to a
// stream with its idempotency key in [DefaultKeyField], its event time in
// [adapter.EventTimeHeader] and its payload in [PayloadField].
// [DeadLetterSender] adds dead letters to their stream with the original
// entry's fields and event time.
package redisstream
