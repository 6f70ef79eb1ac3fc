// Package outbox carries a consumer's effects that leave the database — an
// e-mail, a card charge, a call to another service — exactly once by key:
// the handler writes an outbox row in the same transaction as its claim and
// its other effects, and a relay performs the call later, outside any
// transaction, with an idempotency key the provider uses to drop repeats.
//
// This is step 6 of the guide behind the idempotent package. The database
// stays the single source of truth: if the handler's transaction rolls back,
// the row is gone and the call never happens; if it commits, the call
// happens at least once, and because every attempt carries the same
// idempotency key, the provider performs it once.
//
// # Writing
//
// [New] returns an [Outbox] for one consumer. Inside a handler run by
// idempotent's Middleware.Process, [Outbox.Enqueue] writes the row through
// the handler's *sql.Tx:
//
//	ob, err := outbox.New(db, "receipts")
//	…
//	mw.Process(ctx, key, func(ctx context.Context, tx *sql.Tx) error {
//		_, err := ob.Enqueue(ctx, tx, key, "send_receipt", payload)
//		return err
//	})
//
// The idempotency key is derived from the consumer, the message key and the
// kind ([Key]) unless [WithKey] gives one, so a redelivered message that runs
// its handler again (after its claim was cleaned up, say) produces the same
// key. Enqueue also runs pg_notify, so listening relays wake as soon as the
// transaction commits.
//
// # Relaying
//
// A [Relay] takes due rows with FOR UPDATE SKIP LOCKED in one short
// statement that also leases them (lease owner and expiry) and commits, then
// calls the [Sender] registered for each row's kind with no transaction
// open, then marks the row sent — only if no other relay has leased it
// since. Results are written in batches, so under load one statement marks
// many rows. Any number of relays may run at once. A relay that dies mid-call
// leaves a lease that expires; another relay then calls again with the same
// idempotency key. Failed calls are retried with exponential backoff and
// jitter; after the maximum number of attempts the row is marked dead and
// reported to the [Observer], never retried silently forever. Relays wake on
// LISTEN/NOTIFY ([WithListener]) and poll as a fallback; a relay whose
// LISTEN connection does not receive its own test notification (PgBouncer in
// transaction mode in between) reports [EventListenUnavailable] and polls
// only. [Relay.Run] returns
// after the calls in flight when its context ended have finished.
//
// # Tracing
//
// With [WithTracer] (package oteltrace gives one for OpenTelemetry),
// Enqueue stores the caller's trace context with the row — W3C
// traceparent, tracestate and baggage, bounded — and each attempt of a
// relay runs in the Tracer's send span, a child of that context. The
// Sender finds the span's context in [Message.Trace] and puts it in the
// message's headers, so that the consumer's span continues the trace.
//
// # Housekeeping
//
// [Outbox.Cleanup] deletes sent rows older than a retention window in small
// batches; [Outbox.Stats] reports the pending rows and the age of the oldest,
// the figures to alert on.
//
// # Databases
//
// Only Postgres is supported. Every statement is written in one place
// (statements.go), from a validated, quoted table name, with values passed as
// parameters; another database would add its own set of statements and a
// way to wake relays.
package outbox
