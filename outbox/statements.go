package outbox

import (
	"fmt"
	"hash/fnv"
	"io"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
)

// statements is every SQL statement the outbox runs, for one table. This
// file is the only place SQL text is written: identifiers come from a
// dialect.Table that ParseTable validated and are quoted here; every value is
// a parameter. Durations are passed as whole milliseconds.
//
// Only Postgres is implemented. Another database would add a function like
// postgresStatements returning the same set, with the same parameters and
// result columns, and its own way to wake relays (or none: relays poll).
type statements struct {
	// schema creates the table and its indexes; run in order in one
	// transaction, harmless to run again.
	schema []string

	// enqueue inserts a row: $1 consumer, $2 message_key, $3 kind,
	// $4 idempotency_key, $5 payload (JSON text), $6 event_time and $7
	// event_time_ns (both NULL when unknown; see enqueueConfig.eventTime),
	// $8 trace_parent, $9 trace_state and $10 baggage (NULL when unknown;
	// see traceColumns), $11 order_key and $12 order_seq (NULL when the call
	// has no order; see WithOrder). It returns the new id, or no row when (kind, idempotency_key)
	// exists.
	enqueue string
	// enqueueNotify is enqueue that also notifies channel $13 when it
	// inserted; the notification is delivered when the transaction commits.
	// It returns the id and a column to discard.
	enqueueNotify string

	// lease takes up to $2 due rows of the kinds in $1 (text[]), skipping
	// rows other relays have locked, and leases them to owner $3 for $4 ms.
	// It returns id, consumer, message_key, kind, idempotency_key, payload,
	// attempts (after the increment), created_at, event_time,
	// event_time_ns, trace_parent, trace_state, baggage, order_key and
	// order_seq.
	lease string

	// markSent, markRetry and markDead record the results of attempts, in
	// one statement for many rows: $1 (bigint[]) holds the rows' ids, $3
	// (integer[]) the attempt number of each. A row is updated only if it is
	// still pending and leased by owner $2 for that attempt; the statements
	// return the ids they updated. markRetry makes each row due again after
	// the milliseconds in $4 (bigint[]) and stores the errors in $5
	// (text[]); markDead stores the errors in $4 (text[]).
	markSent  string
	markRetry string
	markDead  string

	// cleanup deletes at most $2 sent rows older than $1 ms.
	cleanup string

	// stats returns the count of pending rows, how many of them are leased,
	// the age of the oldest in ms (0 when none), and the count of dead rows.
	stats string
}

// postgresStatements returns the Postgres statements for table t.
func postgresStatements(t dialect.Table) statements {
	q := t.Quoted(pq.QuoteIdentifier)
	idx := func(suffix string) string { return pq.QuoteIdentifier(indexName(t.Name, suffix)) }
	const ms = "::bigint * interval '1 millisecond'"
	const insert = `INSERT INTO %s (consumer, message_key, kind, idempotency_key, payload, event_time, event_time_ns,
		trace_parent, trace_state, baggage, order_key, order_seq)
	VALUES ($1, $2, $3, $4, $5::json, $6, $7, $8, $9, $10, $11, $12)
	ON CONFLICT (kind, idempotency_key) DO NOTHING
	RETURNING id`
	// Arrays are indexed by array_position rather than joined with
	// unnest, so that the rows are looked up by primary key even before the
	// table has statistics.
	const owned = `id = ANY($1::bigint[]) AND lease_owner = $2 AND state = 'pending'
	AND attempts = ($3::integer[])[array_position($1::bigint[], id)]
RETURNING id`
	const nth = "[array_position($1::bigint[], id)]"
	return statements{
		// Every row is updated twice after its insert, so the table is
		// vacuumed and analyzed after 2% of it changed rather than the
		// default 20%: the due index stays small and the planner knows the
		// backlog. The unique index leads with idempotency_key so that the
		// lease's kind filter never draws the planner away from the due
		// index's order.
		schema: []string{
			fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", schemaLock(t)),
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	consumer         text        NOT NULL,
	message_key      text        NOT NULL,
	kind             text        NOT NULL,
	idempotency_key  text        NOT NULL,
	payload          json        NOT NULL,
	state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
	attempts         integer     NOT NULL DEFAULT 0,
	next_attempt_at  timestamptz NOT NULL DEFAULT now(),
	lease_owner      text,
	lease_expires_at timestamptz,
	last_error       text,
	created_at       timestamptz NOT NULL DEFAULT now(),
	event_time       timestamptz,
	event_time_ns    smallint,
	sent_at          timestamptz,
	dead_at          timestamptz,
	UNIQUE (idempotency_key, kind)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02)`, q),
			// A table made before event_time (or event_time_ns) existed
			// gains it.
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS event_time timestamptz", q),
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS event_time_ns smallint", q),
			// The trace context of the enqueueing transaction (WithTracer):
			// W3C traceparent, tracestate and baggage, bounded.
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS trace_parent text", q),
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS trace_state text", q),
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS baggage text", q),
			// The ordering key and sequence of the call (WithOrder).
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS order_key text", q),
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS order_seq bigint", q),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (next_attempt_at) WHERE state = 'pending'", idx("_due"), q),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (sent_at) WHERE state = 'sent'", idx("_sent_at"), q),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (dead_at) WHERE state = 'dead'", idx("_dead_at"), q),
		},
		enqueue: fmt.Sprintf(insert, q),
		enqueueNotify: fmt.Sprintf(`WITH ins AS (
	`+insert+`
)
SELECT id, pg_notify($13, '')::text FROM ins`, q),
		// ARRAY(…) makes the planner look the leased ids up by primary key
		// even before the table has statistics.
		lease: fmt.Sprintf(`UPDATE %[1]s
SET attempts = attempts + 1,
	lease_owner = $3,
	lease_expires_at = now() + $4%[2]s,
	next_attempt_at = now() + $4%[2]s
WHERE id = ANY(ARRAY(
	SELECT id FROM %[1]s
	WHERE state = 'pending' AND next_attempt_at <= now() AND kind = ANY($1::text[])
	ORDER BY next_attempt_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))
RETURNING id, consumer, message_key, kind, idempotency_key, payload, attempts, created_at, event_time, event_time_ns,
	trace_parent, trace_state, baggage, order_key, order_seq`, q, ms),
		markSent: fmt.Sprintf(`UPDATE %s
SET state = 'sent', sent_at = now(), lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
WHERE %s`, q, owned),
		markRetry: fmt.Sprintf(`UPDATE %s
SET next_attempt_at = now() + ($4::bigint[])%s%s, lease_owner = NULL, lease_expires_at = NULL,
	last_error = ($5::text[])%s
WHERE %s`, q, nth, ms, nth, owned),
		markDead: fmt.Sprintf(`UPDATE %s
SET state = 'dead', dead_at = now(), lease_owner = NULL, lease_expires_at = NULL, last_error = ($4::text[])%s
WHERE %s`, q, nth, owned),
		cleanup: fmt.Sprintf(`DELETE FROM %[1]s
WHERE state = 'sent' AND sent_at < now() - $1%[2]s
	AND ctid IN (SELECT ctid FROM %[1]s WHERE state = 'sent' AND sent_at < now() - $1%[2]s LIMIT $2)`, q, ms),
		stats: fmt.Sprintf(`SELECT count(*),
	count(*) FILTER (WHERE lease_expires_at > now()),
	COALESCE((EXTRACT(EPOCH FROM now() - min(created_at)) * 1000)::bigint, 0),
	(SELECT count(*) FROM %[1]s WHERE state = 'dead')
FROM %[1]s WHERE state = 'pending'`, q),
	}
}

// schemaLock is the advisory lock taken while creating table t, so that
// processes creating it at the same moment do not collide on the catalog.
func schemaLock(t dialect.Table) int64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, "idempotent:outbox-schema:"+t.String())
	return int64(h.Sum64())
}

// indexName returns name+suffix, or, when that would pass Postgres's 63-byte
// limit (where Postgres would cut it, and two long table names could end up
// sharing an index name), a shortened name with a hash of the table name.
func indexName(name, suffix string) string {
	const limit = dialect.MaxIdentifierBytes
	if len(name)+len(suffix) <= limit {
		return name + suffix
	}
	h := fnv.New32a()
	_, _ = io.WriteString(h, name)
	tag := fmt.Sprintf("_%08x", h.Sum32())
	return name[:limit-len(suffix)-len(tag)] + tag + suffix
}

// notifyChannel is the LISTEN/NOTIFY channel of table t: short enough for
// Postgres's 63-byte limit whatever the table's name.
func notifyChannel(t dialect.Table) string {
	h := fnv.New64a()
	_, _ = io.WriteString(h, t.String())
	return fmt.Sprintf("outbox_%016x", h.Sum64())
}
