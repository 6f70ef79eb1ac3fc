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
//	c, _ := kafka.NewConsumer(db, mw, nil, // nil: the "idempotency-key" header
//		kafka.Decode(kafka.JSON[Payment], func(ctx context.Context, tx *sql.Tx, p Payment) error {
//			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, p.Account, p.Amount)
//			return err
//		}))
//	err := c.Run(ctx, kgo.SeedBrokers("localhost:9092"),
//		kgo.ConsumerGroup("payments"), kgo.ConsumeTopics("payments"))
//
// [NewBatchConsumer] is the throughput path: the records of one poll for one
// partition are claimed together ([idempotent.Middleware.ProcessMessages],
// with each record's timestamp as its event time, so a claim table
// partitioned by event day works too), applied by one set-wise
// [BatchHandler], and advance the offset once. A record the Middleware would
// refuse (too old for the retention window, dated in the future) is
// dead-lettered alone, and the rest of the batch applies.
//
// # The message key
//
// The claim key is an identity the producer assigned: by default the
// [DefaultKeyHeader] header ("idempotency-key"); [CloudEventsID] reads a
// CloudEvent's ce_id; [BodyField] a field of a JSON value; any [KeyFunc]
// will do. It is never the topic, partition or offset: a producer retry, or
// a replay to another topic, gives the same message a new offset. A record
// without a key is poison.
//
// # One transaction per record (or per batch)
//
// For each record the Consumer opens a transaction and, in it:
//
//  1. advances the partition's row of the offsets table
//     (consumer, topic, partition) → next_offset from the offset it read to
//     the record's offset + 1 — a compare-and-set, forward only — and
//     claims the key, as idempotent's ClaimMessage does (with the record's
//     timestamp as the event time, so a record older than the retention
//     window is poison), both in one statement: a prepared statement of two
//     data-modifying common table expressions, which reports whether the
//     offset advanced and whether the claim is new;
//  2. runs the handler, only if the offset advanced and the claim was new;
//  3. commits.
//
// So the stored offset costs no statement of its own: a record's
// transaction sends BEGIN, that statement, the handler's statements and
// COMMIT, where a hand-written loop that commits its offsets to Kafka sends
// BEGIN, the claim, the handler's statements and COMMIT. Should that
// statement fail to prepare (a table is missing, say), the transaction runs
// the advance and the claim as two statements, whose errors name the
// missing table: [ErrNoOffsetsTable] or [idempotent.ErrNoClaimTable]. With
// idempotent.WithLockTimeout the lock timeout is set before that statement,
// so it bounds the offset advance's lock wait as well as the claim's.
//
// A duplicate (the claim existed) commits the offset advance alone. A poison
// record — no key ([ErrNoKey]), an invalid key, an undecodable value
// ([ErrUndecodable]), too old ([idempotent.ErrBeyondRetention]), or a
// handler error marked with [Poison] — is rolled back and written instead,
// in a transaction that advances its offset, as one outbox row
// ([DeadLetterKind], see [WithDeadLetter]); an outbox Relay with
// [DeadLetterSender] produces it to the dead-letter topic. As the row and
// the offset advance commit together, each poison record is dead-lettered
// exactly once. Any other failure rolls back and retries the same record in
// place after a bounded backoff ([WithRetryDelay]); a record is never
// skipped. Serialization failures and lost connections are first retried
// within the attempt, as [idempotent.RunTx] does.
//
// After the commit the offsets are also committed to Kafka, asynchronously,
// for lag tools only.
//
// # Which offset is the truth
//
// The database's. It is written in the transaction that wrote the effect,
// so it can never disagree with the effects: an effect is committed if and
// only if the offset past its record is. Kafka's committed offset is written
// after, by another system, and may lag behind (a crash between the two) or
// even run ahead of what a restored database holds. So on every assignment
// the Consumer seeks each partition to the offset stored in the database
// (kgo's AdjustFetchOffsetsFn); only a partition with no stored offset
// starts where the group's Kafka commit, or the reset offset, says.
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
// # A rebalance
//
// Run uses kgo's BlockRebalanceOnPoll: the group cannot take a partition
// away while a poll's records are being applied. When a rebalance is
// waiting, each partition finishes the transaction in flight and abandons
// the rest of the poll (nothing of them was written); then the member lets
// the rebalance proceed, and the next owner seeks to the stored offset:
//
//	member A: applying 100..149 of p0; B joins; rebalance waits
//	member A: commits 117, abandons 118..149, allows the rebalance
//	database: next_offset = 118
//	member B: assigned p0 → seeks to 118 → applies 118, 119, …
//
// A member that stalls (a stuck handler, a long GC pause) past the group's
// rebalance timeout is fenced out of the group while it still believes it
// owns the partition: a zombie. Its next offset advance expects the offset
// it read, finds the new owner's instead, and fails — the transaction rolls
// back before the handler runs, so the zombie applies nothing, dead-letters
// nothing, and never moves the offset backwards ([ErrFenced], reported as
// [EventFenced]). It then re-reads the partition from the stored offset if
// it still owns it.
//
// # Order and concurrency
//
// Records of one partition are applied one after another, in offset order;
// partitions are applied concurrently by up to [WithWorkers] goroutines.
//
// # Shutdown and failures
//
// [Consumer.Run] returns nil after a graceful shutdown (its context ended:
// transactions in flight committed, offsets committed to Kafka, group left),
// and an error matching [ErrClient] when the client fails for good. Offsets
// live in the table [EnsureSchema] creates (or the migration files of the
// migrations package: see [SchemaSQL]); only Postgres is supported.
//
// # The demo
//
// go run ./examples/loyalty -broker kafka runs a Consumer and the usual
// hand-written loop (offsets committed to Kafka after the database commit)
// through crashes, dropped connections, producer duplicates and a replay, on
// an in-process Kafka-protocol cluster, and audits both: see docs/demo.md.
package kafka
