// Package kafka consumes Kafka topics as a consumer-group member (through
// github.com/twmb/franz-go) and applies each record's database effect exactly
// once with an [idempotent.Middleware] — and it stores each partition's
// offset in the database, advanced in the same transaction as the claim and
// the effect.
//
// # Quickstart
//
//	db, _ := sql.Open("postgres", dsn)
//	mw, _ := idempotent.New(db, postgres.New(), "payments")
//	_ = mw.EnsureSchema(ctx)
//	_ = kafka.EnsureSchema(ctx, db, kafka.DefaultOffsetsTable)
//
//	c, _ := kafka.NewConsumer(mw, // the key: the "idempotency-key" header
//		kafka.Decode(kafka.JSON[Payment], func(ctx context.Context, tx *sql.Tx, p Payment, r *kgo.Record) error {
//			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, p.Account, p.Amount)
//			return err
//		}))
//	err := c.Run(ctx, kgo.SeedBrokers("localhost:9092"),
//		kgo.ConsumerGroup("payments"), kgo.ConsumeTopics("payments"))
//
// The Consumer's transactions run on the database the Middleware was
// created with ([adapter.Path]): the offsets table lives beside the claim
// table.
//
// [NewBatchConsumer] is the throughput path: the records of one poll for one
// partition are claimed together, in batches of at most [WithBatchSize]
// ([idempotent.Middleware.ProcessMessages], each record with its event
// time, so a claim table partitioned by event day works too), applied by
// one set-wise [BatchHandler], and advance the offset once per batch. A record the Middleware would refuse is settled alone (see
// Settling a record): a poison one is dead-lettered and the rest of the
// batch applies; one dated a little in the future ends the batch before it,
// and waits.
//
// # The event time comes from the producer
//
// A record's event time — what the retention fence and a claim table's
// daily partitions rest on — is read from its adapter.EventTimeHeader header
// ("Idempotent-Event-Time", an RFC 3339 time: adapter.FormatEventTime
// writes it), which the producer sets once and every re-send copies, like
// the key. [WithEventTime] reads it with a function over the record instead
// ([TimeHeader] reads a header of the producer's own).
// A record without the header has no event time: on a plain claim table it
// is claimed without one (the retention fence cannot refuse it); on a claim
// table partitioned by event day it is poison (idempotent.ErrInvalidEventTime).
// A header that is not an RFC 3339 time is poison (adapter.ErrBadEventTime).
//
// The Kafka record timestamp is not the event time unless
// [WithTransportEventTime] says so: a re-send — an application retry, an
// outbox relay after a lost acknowledgement, a replay from the dead-letter
// topic — is a new record with a new timestamp, and after UTC midnight its
// claim would go to another day's partition, which cannot see the first
// claim, and apply a second time. [WithoutEventTime] reads none; a
// Middleware in partitioned mode refuses both at construction
// (adapter.ErrNoProducerEventTime). A dead letter's outbox row holds the
// record's event time (outbox.WithEventTime), and [DeadLetterSender]
// carries it to the dead-letter topic in the same header.
//
// # The message key
//
// The claim key is an identity the producer assigned: by default the
// [DefaultKeyHeader] header ("idempotency-key"), as Kafka records carry no
// producer-set message id; [WithKey] takes another: [Header],
// [CloudEventsID] (a CloudEvent's ce_id), [BodyField] (a field of a JSON
// value), [Prefixed], or any [KeyFunc]. It is never the topic, partition
// or offset: a producer retry, or a replay to another topic, gives the same
// message a new offset. A record without a key is poison
// (adapter.ErrNoKey).
//
// # One transaction per record (or per batch)
//
// For each record the Consumer opens a transaction and, in it:
//
//  1. advances the partition's row of the offsets table
//     (consumer, topic, partition) → next_offset from the offset it read to
//     the record's offset + 1 — a compare-and-set, forward only, that also
//     stores the topic's Kafka topic ID — and claims the key, as
//     idempotent's ClaimMessage does (with the record's event time, so a
//     record older than the retention window is poison),
//     both in one statement: a prepared statement of two data-modifying
//     common table expressions, which reports whether the offset advanced
//     and whether the claim is new;
//  2. runs the handler, only if the offset advanced and the claim was new;
//  3. commits.
//
// So the stored offset costs no statement of its own: a record's
// transaction sends BEGIN, that statement, the handler's statements and
// COMMIT, where a hand-written loop that commits its offsets to Kafka sends
// BEGIN, the claim, the handler's statements and COMMIT. Should that
// statement fail to prepare (a table is missing, say), the transaction runs
// the advance and the claim as two statements, whose errors name the
// missing table: [ErrNoOffsetsTable] or [idempotent.ErrNoClaimTable].
//
// # Coalesced transactions
//
// With a Middleware created with idempotent.WithCoalescing, [NewConsumer]'s
// records coalesce as ProcessMessage calls do: the records of different
// partitions in flight at the same time — one per partition, each worker
// applying its partition's records one after another in offset order, so a
// group never holds two records of one partition — share one transaction,
// up to Max records: the group closes when it has Max, or a record of
// every partition the Consumer's workers are applying (a record waiting
// out its requeue delay is not counted), or Wait after its first record,
// whichever comes first, so that a lone partition's records do not wait
// out Wait. The group's transaction sends BEGIN, each record's claim just
// before its handler (on its worker's goroutine, one after the other), one
// statement that advances the offsets of every record of the group
// (duplicates included; a compare-and-set per partition, as above, in
// topic and partition order), and COMMIT. A group whose records were all
// duplicates commits its offset advances too. A record alone in its group
// (no other partition had a record to apply), or one the
// group's claim could not claim (a missing day partition, the retention
// fence, a key held past the lock timeout), runs in its own transaction as
// above.
//
// A handler that fails fails its record alone: by default the group's
// transaction rolls back and runs again without it (the other handlers run
// again; nothing of them had committed), and with Coalescing.Savepoints
// the record is rolled back to a savepoint of its own. Either way the
// failed record's offset is not advanced; it is settled by the rule below
// — requeued in place with its delay, its partition waiting behind it, or
// dead-lettered — while the group's other records commit. A record whose
// offset advance finds the stored offset elsewhere is fenced alone. A
// failure of the group's transaction itself (a serialization failure, a
// deadlock, a lost connection, a COMMIT whose answer was lost) is retried
// for the whole group under the Middleware's retry policy; after a lost
// COMMIT that landed, the retry finds each record's claim taken and its
// offset moved on, and each partition is read again from the stored
// offset. The strict guard checks after every handler. [NewBatchConsumer]
// does not coalesce: its batches are already one transaction each.
//
// What coalescing saves is the per-record BEGIN, claim, offset advance and
// COMMIT; what it costs is that a group's handlers run one after the other
// on one connection instead of on WithWorkers connections at once. It pays
// where the commit or the connection pool limits throughput (more workers
// than connections), not where the workers' round trips do — with a pool
// as large as WithWorkers, one group of every partition keeps one
// connection busy where WithWorkers transactions kept WithWorkers busy; a
// Max of WithWorkers divided by the connections to keep busy runs that
// many groups at once. Measure with your workload: this package's tests
// have BenchmarkCoalescedRecords (variants in turn) and
// BenchmarkCoalescedRecordsHeadToHead (the plain and a coalescing consumer
// at the same time, and their ratio).
//
// A handler that ends or breaks the group's transaction itself fails its
// record alone, loudly (idempotent.ErrAutocommit), as it does in
// ProcessMessage's groups: its partition stops, and the group's other
// records run again in a transaction of their own.
//
// # Settling a record
//
// What a failed record comes to is decided in one place, adapter.Rule.Settle,
// the rule every adapter of this module shares: an error matching
// adapter.ErrPoison (adapter.Poison, adapter.ErrUndecodable) or a
// [WithPoison] predicate is poison. A duplicate (the claim existed) commits
// the offset advance alone. A poison record — no key (adapter.ErrNoKey), an
// invalid key, an undecodable value, too old
// ([idempotent.ErrBeyondRetention]), a bad event-time header, dated in the
// future beyond the rule's bound (the Middleware's clock-skew margin past
// the clock plus that margin, unless [WithFutureBound] says otherwise: a
// producer whose clock is off by a time zone, a seconds-for-milliseconds
// mix-up), or a
// handler error marked poison — is rolled back and written instead, in a
// transaction that advances its offset, as one outbox row
// ([DeadLetterKind], see [WithDeadLetter]); an outbox Relay with
// [DeadLetterSender] produces it to the dead-letter topic. As the row and
// the offset advance commit together, each poison record is dead-lettered
// exactly once. Package deadletter (and "idempotent dead-letters") lists,
// replays and discards those rows; a Relay with [ReplaySender] for
// [ReplayKind] produces a replay to its source topic with the original key,
// headers and event time. Every other failure is a requeue: Kafka keeps a partition's
// records in order, so the Consumer rolls back and tries the same record
// again in place after the rule's delay — RetryPolicy.Backoff of
// [WithRetryDelay]'s bounds, for the attempt — and a record is never
// skipped. A record dated in the future within the bound waits so, with
// the records behind it, until the Middleware's clock reaches its event
// time (less the clock-skew margin): that is the rule's delay then. A
// partition is ordered (adapter.Transport.Ordered), so the bound is short
// by default — a record holds its partition no longer than the clock-skew
// margin — where a queue's adapters wait up to adapter.DefaultFutureBound.
// adapter.EventRequeued reports each wait, with the attempt and the delay;
// a rebalance or the shutdown ends the wait (the record is then released,
// and read again by the partition's next owner). A poll's records are
// finished before the next poll, so while one partition waits the member
// fetches nothing new for its other partitions either: keep WithRetryDelay's
// max and [WithFutureBound] to what the topic can afford to wait.
//
// After the commit the offsets are also committed to Kafka, asynchronously,
// for lag tools only.
//
// # The Middleware's options apply
//
// Every transaction runs on the Middleware's own claim path, as
// [idempotent.Middleware.ProcessMessage] runs one, so the options given to
// idempotent.New apply to it: the transaction options
// (idempotent.WithTxOptions: the isolation level), the retry policy of
// serialization failures, deadlocks and lost connections
// (idempotent.WithRetry, within each attempt, before WithRetryDelay's
// backoff), the lock timeout (idempotent.WithLockTimeout, set before the
// statement of step 1, so it bounds the offset advance's lock wait as well
// as the claim's), the strict guard (idempotent.WithStrictGuard) and the
// Middleware's Observer. This package has no copies of them.
//
// With the strict guard, a handler that ends the transaction itself — a
// COMMIT sent through tx, "SELECT 1; COMMIT" say — and then fails is caught
// as Process catches it ([idempotent.ErrAutocommit]): the claim and the
// offset advance committed without the whole effect, so the record cannot
// be retried (its offset has moved) and must not be passed over in silence.
// The Consumer stops the partition (adapter.EventStopped, Err matching
// idempotent.ErrAutocommit, Source and Detail the record), after reporting
// the record released with that error: repair the effect by hand, then
// restart the member.
//
// The Middleware's duplicate pre-check (idempotent.WithSeen) is never
// consulted, nor fed: a key it remembers may belong to a claim a database
// restore took away, and answering Duplicate from its memory would advance
// the stored offset past a record whose effect is gone. The offset moves
// only in a transaction that claimed (or found claimed) every record it
// passes, in the database itself.
//
// # A database per tenant
//
// [WithTenant] applies each partition's records with its tenant's
// Middleware in an idempotent.Tenants: the tenant is a function of the
// topic and partition, since a partition's offset advances in the
// transaction that claims its record and so lives in one database, the
// tenant's, beside its claims (the offsets table must exist in every
// tenant's database). NewConsumer and NewBatchConsumer are then given a nil
// Middleware; one created WithCoalescing is refused, as a coalesced group
// spans partitions. A tenant whose database is down holds back its own
// partitions only: a record that failed waits its retry delay, then the
// poll's records of that partition are released and fetched again from
// the stored offset, so the other tenants' partitions are not held behind
// it; a partition assigned while its tenant's database is down starts at
// its stored offset once it can be read.
//
// # Which offset is the truth
//
// The database's. It is written in the transaction that wrote the effect,
// so it can never disagree with the effects: an effect is committed if and
// only if the offset past its record is. Kafka's committed offset is written
// after, by another system, and may lag behind (a crash between the two) or
// even run ahead of what a restored database holds. So on every assignment
// the Consumer seeks each partition to the offset stored in the database
// (kgo's AdjustFetchOffsetsFn). A partition with no stored offset — a new
// consumer, a new partition, a database restored from before the
// partition's first record, an offsets table truncated by hand — starts at
// the reset position, never at Kafka's committed offset: the log start by
// default, so that every record the log still holds applies (the ones whose
// claims survived are duplicates), or its end with
// WithResetPosition(ResetLatest). [WithAdoptGroupOffsets] is the one way to
// start such a partition at the group's Kafka commit, for moving an existing
// consumer group onto this package; remove it once every partition has a
// stored offset.
//
// # When the log moves under the stored offset
//
// The stored offset means "the next record to apply is here". Before it
// applies a partition's records the Consumer checks that the log still
// continues from there, and stops the partition when it does not:
//
//   - the fetch reports another topic ID than the one stored with the
//     offset: the topic was deleted and re-created, and its offsets start
//     again from 0;
//   - the log start offset is above the stored offset: records at or after
//     it were deleted (DeleteRecords, retention) before they were applied;
//   - the high watermark, or the first record fetched, is below the stored
//     offset: the log moved backwards (a re-created topic, an unclean leader
//     election);
//   - the client itself reports the loss: an offset out of the log (the
//     Consumer sets kgo.ConsumeResetOffset(kgo.NoResetOffset()), so the
//     client never resets on its own) or a kgo.ErrDataLoss.
//
// A first record above the stored offset is not a loss by itself:
// transaction markers, aborted records and compaction leave offsets with no
// record to read. A stopped partition applies nothing more and moves no
// offset; the Observer is told (adapter.EventStopped, whose Err is a
// [*LogGapError] naming the topic, the partition and the offsets, matching
// [ErrLogGap]) and the member stops fetching it. Nothing is skipped: decide
// where to go on, set it with the CLI ("idempotent kafka-offsets reset
// -table … -consumer … -topic … -partition N -offset M", which also forgets
// the stored topic ID), and restart the member (a rebalance that moves the
// partition to another member resumes it there too). A topic ID is known where the brokers report one in fetches
// (Kafka 3.1 and later); with older brokers a re-created topic is caught
// only by the offsets.
//
// Records are read with read-committed isolation
// (kgo.FetchIsolationLevel(kgo.ReadCommitted()), forced): the records of
// an aborted Kafka transaction are never applied, nor those of a
// transaction still open.
//
// # A crash
//
//	member A: poll 100..149 → tx(100) commit → tx(101) commit → tx(102) … crash
//	database: next_offset = 102; record 102's transaction rolled back
//	Kafka:    committed offset maybe 90 (async), maybe 102
//	member B: assigned the partition → reads next_offset 102 → seeks to 102
//	          → applies 102, 103, … (nothing replayed, nothing skipped)
//
// Had A's COMMIT of 102 landed but its reply been lost, B reads 103. Records
// a producer re-sent arrive with new offsets and are duplicates by their
// claims.
//
// # A database restore
//
//	database restored: p0 next_offset = 5, claims and effects of 5..9 gone;
//	                   p1 has no row (restored from before its first record)
//	Kafka:    committed offsets 10 and 8: a restore does not roll them back
//	member:   p0 → seeks to 5 → applies 5..9 again (their claims are gone)
//	          p1 → no row → starts at the log start → applies every record
//	               the log holds (none was claimed in the restored database)
//
// Had the restore gone back before a topic was re-created, or had the log
// lost records below a stored offset meanwhile, the partition stops instead
// (see above).
//
// # A rebalance
//
// Run uses kgo's BlockRebalanceOnPoll: the group cannot take a partition
// away while a poll's records are being applied. When a rebalance is
// waiting, each partition finishes the transaction in flight and releases
// the rest of the poll (nothing of them was written); then the member lets
// the rebalance proceed, and the next owner seeks to the stored offset:
//
//	member A: applying 100..149 of p0; B joins; rebalance waits
//	member A: commits 117, releases 118..149, allows the rebalance
//	database: next_offset = 118
//	member B: assigned p0 → seeks to 118 → applies 118, 119, …
//
// A member that stalls (a stuck handler, a long GC pause) past the group's
// rebalance timeout is fenced out of the group while it still believes it
// owns the partition: a zombie. Its next offset advance expects the offset
// it read, finds the new owner's instead, and fails — the transaction rolls
// back before the handler runs, so the zombie applies nothing, dead-letters
// nothing, and never moves the offset backwards ([ErrFenced], reported as
// adapter.EventFenced). It then re-reads the partition from the stored
// offset if it still owns it.
//
// # Events
//
// The Observer ([WithObserver]) hears the events every adapter reports
// (adapter.Event), and [Consumer.Stats] counts them. Every record fetched
// ends in exactly one of adapter.EventApplied, EventDuplicate,
// EventDeadLettered (its Err says why it was poison) and EventReleased
// (given up unapplied: a rebalance or the shutdown was waiting, the
// partition was fenced or stopped), after any number of EventRequeued (an
// attempt failed and is retried in place after Delay; Attempt counts the
// attempts). Each carries the record's key and event time in Message where
// they could be read, its position "topic/partition/offset" in Source, and
// the *kgo.Record as Detail — except a poison record dropped for want of a
// dead-letter outbox, whose Detail is a [Dropped]. EventFenced and
// EventStopped name the record concerned the same way (a stop for a log
// gap concerns none: its Source is the stored offset's position);
// EventAssigned, EventRevoked and EventLost have a [Rebalance] as Detail;
// EventFetchError and EventCommitFailed name the partition
// ("topic/partition") in Source where the client says which.
//
// # Order and concurrency
//
// Records of one partition are applied one after another, in offset order;
// partitions are applied concurrently by up to [WithWorkers] goroutines.
//
// # Ordered per key
//
// With a Middleware created idempotent.WithOrdering, a record that carries
// an ordering key and a sequence (the headers adapter.OrderKeyHeader and
// adapter.OrderSeqHeader; the ordering key is never taken from the record
// key) applies in its entity's sequence order, checked in the database
// (docs/ordering.md), per record and in batches. Such a record is claimed
// by the Middleware's ordered step, in a transaction that advances the
// partition's offset first: one that is next applies, and releases its
// parked successors, with its offset; one that arrives early (sequence 3
// produced before 2, or an entity's records spread over partitions because
// the record key is not the entity) is parked with its value and headers
// and acknowledged — its offset advances with the park, and the partition
// reads on; a duplicate (a redelivery after a rebalance, a dead-letter
// replay of an old sequence) applies nothing and its offset advances in a
// transaction of its own. [ParkedRecord] rebuilds a parked record for the
// Ordering's Release. Key records by their entity and an entity's records
// share a partition and arrive in order: none parks. Ordered records run
// outside coalesced groups (WithCoalescing), each in its own transaction,
// and with WithSeen they consult the duplicate pre-check, as
// ProcessMessage does (a record it knows is not claimed; its offset
// advances as a duplicate's). Records without the headers are claimed as
// before.
//
// # Shutdown and failures
//
// [Consumer.Run] returns nil after a graceful shutdown (its context ended:
// transactions in flight committed, offsets committed to Kafka, group left),
// and an error matching [ErrClient] when the client fails for good. Offsets
// live in the table [EnsureSchema] creates (or the migration files of the
// migrations package: see [SchemaSQL]); only Postgres is supported.
// EnsureSchema reads the catalog before any DDL and bounds its lock waits
// ([SchemaLockTimeout]), so a start never queues running consumers'
// transactions behind it.
//
// # The demo
//
// go run ./examples/loyalty -broker kafka runs a Consumer and the usual
// hand-written loop (offsets committed to Kafka after the database commit)
// through crashes, dropped connections, producer duplicates and a replay, on
// an in-process Kafka-protocol cluster, and audits both: see docs/demo.md.
package kafka
