// Package brokertest is the conformance suite for broker adapters of
// github.com/txclaim/idempotent — this module's (rabbitmq, kafka, nats,
// watermill) and a third party's — as dialect/dialecttest is for dialects:
// the checks every adapter must pass, in every mode it has, for the
// Middleware's promise to hold through the broker.
//
// An adapter's test hands [Run] a [Harness]: its [Features] and a way to
// open a fresh [Transport] (a topic, stream or queue of the scenario's own)
// that publishes a [Message] (key, headers — the producer's event time in
// adapter.EventTimeHeader among them —, body) and builds a [Consumer] over
// a [ConsumerConfig] the suite gives: the *idempotent.Middleware (the
// suite's, on a claim table in a schema of the scenario's own, with a
// clock the suite sets through idempotent.WithClock), the effect, the mode,
// and an adapter.Observer to give the adapter's WithObserver, from whose
// events the suite reads each delivery's [Settlement] (ack, requeue,
// dead-letter, by key). The suite then runs, against the real test Postgres and
// the adapter's real broker, each as a subtest skipped where the features
// say it does not apply:
//
//   - Redelivery: one key sent twice → one Applied, one Duplicate, two
//     acks, one effect;
//   - CrashAfterCommit (Features.LoseAck): the first ack is lost after the
//     commit → the redelivery is a Duplicate, one effect;
//   - HandlerErrorThenSuccess: the handler writes half its effect and
//     fails → requeued with its error, then applied once, balances exact;
//   - ConcurrentDuplicates: eight copies, four workers → one effect;
//   - PoisonHeader: an event-time header that is not RFC 3339 → poison
//     exactly once (adapter.ErrBadEventTime), nothing written, the good
//     message beside it applied;
//   - Partitioned/RefusedWithoutEventTime: on a day-partitioned table a
//     consumer without a producer event time is refused at construction
//     (adapter.ErrNoProducerEventTime);
//   - Partitioned/ResendAcrossMidnight: produced at 23:30, re-sent at
//     00:30 with a later transport time and the same header → Duplicate,
//     the claim on the event's day;
//   - TooOld: older than the retention window → poison
//     (idempotent.ErrBeyondRetention), nothing written;
//   - FutureDated: beyond the adapter's default future bound
//     (adapter.DefaultFutureBound; the clock-skew margin where
//     Features.Ordered) → poison; within it → requeued (with the delay
//     until the clock catches up, where the adapter reports delays),
//     nothing written — checked on the settlement, never by waiting for
//     the clock;
//   - GracefulShutdownMidHandler: Stop while a handler runs → the message
//     is finished (or redelivered to the next consumer, Features.Restart)
//     and applied once, and one published meanwhile is not lost;
//   - KillMidHandler (Features.Kill): a crash while the handler runs, the
//     handler then committing → the next consumer's delivery applies it
//     exactly once;
//   - StrictGuard: a handler that runs COMMIT on the claim's transaction
//     is refused (idempotent.ErrAutocommit), never acked, nothing commits;
//   - TxOptions: idempotent.WithTxOptions reaches the handler's
//     transaction;
//   - PreCheck: with the duplicate pre-check on (idempotent.WithSeen), a
//     redelivery is a Duplicate and a message whose first attempt failed
//     is not taken as seen: each applied exactly once;
//   - CommitFails: the handler succeeds and the COMMIT fails (a deferred
//     constraint trigger) → requeued, never acked before its effect
//     committed, applied once after the fault is removed;
//   - ClaimBusy: another transaction holds the claim past
//     idempotent.WithLockTimeout → requeued with idempotent.ErrClaimBusy,
//     never terminated, applied once after the holder rolled back;
//   - RetriesExhausted: a serialization failure on every attempt the
//     retry policy allows → requeued with idempotent.ErrRetriesExhausted,
//     never terminated, applied once;
//   - Partitioned/NoEventTimeHeader: on a day-partitioned table a message
//     without adapter.EventTimeHeader → poison exactly once
//     (adapter.ErrNoEventTime), never claimed on a day taken from the
//     transport;
//   - PositionInClaimTransaction ([PositionStore]): the position the
//     adapter stores in the database (a Kafka offset) is written by the
//     effect's own transaction.
//
// Where the [Transport] is an [Inspector], the suite also checks at the
// broker: once every consumer stopped, no message of a scenario that
// settles them all is left unacked or undelivered (an ack the adapter
// reported that never reached the broker, or a delivery acked before its
// transaction failed, shows there), and with Features.DeadLetter every
// poison message is in the dead-letter destination exactly once.
//
//   - Mistake/<mistake>: the handler's first run of one message among two
//     neighbours returns an error, swallows a database error, or uses a
//     cancelled context → requeued, then applied once; or ends the claim's
//     transaction — tx.Commit(), a COMMIT statement, with and without
//     idempotent.WithStrictGuard — → dead-lettered once, matching
//     idempotent.ErrAutocommit, nothing of it committed (on an ordered
//     transport the adapter may instead stop the partition, releasing the
//     message with that error: then nothing may be acked without its
//     effect). The neighbours are applied once, whatever group or batch
//     they shared with it.
//
// Every scenario runs under "per-message/"; with Features.Batch every
// scenario about a mode runs again as "batch/<scenario>" with the
// adapter's batch consumer, which must settle each message of a batch on
// its own. The core scenarios (Redelivery, CrashAfterCommit,
// HandlerErrorThenSuccess, ConcurrentDuplicates, PoisonHeader,
// CommitFails, ClaimBusy, RetriesExhausted, every Mistake) run again with
// four workers in the modes [Coalesced], [CoalescedSavepoints] and
// [PreCheck]. A mode in Features.Refuses runs no scenario: the suite checks
// the adapter's NewConsumer refuses it.
//
// Each scenario audits its effects exactly: one ledger row per applied
// message, one claim each, every balance equal to the sum of the messages
// applied. Waits are bounded polls on the settlements reported, never
// sleeps. docs/adapters.md shows a harness.
package brokertest
