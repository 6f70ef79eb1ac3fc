package deadletter

import (
	"fmt"
	"strings"

	"github.com/txclaim/idempotent/dialect"
)

// statements is every SQL statement a Store runs, for one outbox table and
// its audit table. This file is the only place their text is written:
// identifiers come from tables dialect.ParseTable validated and are quoted
// here; every value is a parameter. Lists (kinds, ids) are passed as one
// comma-separated text parameter, so that any driver binds them.
//
// Only Postgres is implemented, as for the outbox the dead letters live in.
type statements struct {
	// schema creates the audit table and its index; run in order in one
	// transaction, harmless to run again.
	schema []string

	// list returns the dead letters that match a filter, in id order:
	// $1 kinds (comma-separated), $2 consumer, $3 source topic or stream,
	// $4 message key, $5 a text the reason contains, $6 and $7 the bounds
	// of created_at (from, before), $8 ids (comma-separated), each NULL
	// for no condition; $9 the last id of the previous page (0 for the
	// first), $10 the page size. Its columns are those scanRow reads.
	list string
	// lock is list that also locks the rows it returns (FOR UPDATE), for
	// replay and discard.
	lock string

	// record inserts an audit row: $1 dead letter id, $2 consumer, $3 kind,
	// $4 message key, $5 action, $6 actor, $7 reason, $8 replay kind, and
	// returns its id and time.
	record string
	// setReplayKey stores $2, the replay's idempotency key, in audit row $1.
	setReplayKey string
	// remove deletes the dead letters whose ids are in $1
	// (comma-separated) and whose kind is among $2 (comma-separated), and
	// returns their ids.
	remove string
	// counts returns how many dead letters of kinds $1 (comma-separated)
	// there are, by consumer, kind and source topic or stream ("" when the
	// payload names none).
	counts string
	// history returns the audit rows of dead letter $1, oldest first: id,
	// action, actor, at, replay kind, replay key, reason.
	history string
}

// columns is what list and lock return, in scanRow's order.
const columns = `id, consumer, kind, message_key, idempotency_key, payload::text, state, attempts,
	created_at, event_time, event_time_ns, last_error, sent_at, dead_at`

// where is the filter of list and lock.
const where = `kind = ANY(string_to_array($1::text, ','))
	AND ($2::text IS NULL OR consumer = $2::text)
	AND ($3::text IS NULL OR COALESCE(payload->>'source_topic', payload->>'source_stream', NULLIF(payload->>'source', ''), payload->>'source_key') = $3::text)
	AND ($4::text IS NULL OR message_key = $4::text)
	AND ($5::text IS NULL OR strpos(payload->>'error', $5::text) > 0)
	AND ($6::timestamptz IS NULL OR created_at >= $6::timestamptz)
	AND ($7::timestamptz IS NULL OR created_at < $7::timestamptz)
	AND ($8::text IS NULL OR id = ANY(string_to_array($8::text, ',')::bigint[]))
	AND id > $9`

// quote quotes a Postgres identifier.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// postgresStatements returns the Postgres statements for the outbox table
// ob and the audit table audit.
func postgresStatements(ob, audit dialect.Table) statements {
	o, a := ob.Quoted(quote), audit.Quoted(quote)
	sel := fmt.Sprintf("SELECT "+columns+"\nFROM %s\nWHERE "+where+"\nORDER BY id\nLIMIT $10", o)
	return statements{
		schema: []string{
			// Processes creating the table at the same moment would collide
			// on the catalog: they take turns.
			fmt.Sprintf("SELECT pg_advisory_xact_lock(hashtext('idempotent:dead-letter-audit:%s'))", audit),
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	dead_letter_id bigint      NOT NULL,
	consumer       text        NOT NULL,
	kind           text        NOT NULL,
	message_key    text        NOT NULL,
	action         text        NOT NULL CHECK (action IN ('replay', 'discard')),
	actor          text        NOT NULL,
	at             timestamptz NOT NULL DEFAULT now(),
	reason         text,
	replay_kind    text,
	replay_key     text
)`, a),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (dead_letter_id)", quote(audit.Name+"_dead_letter_id"), a),
		},
		list: sel,
		lock: sel + "\nFOR UPDATE",
		record: fmt.Sprintf(`INSERT INTO %s (dead_letter_id, consumer, kind, message_key, action, actor, reason, replay_kind)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id, at`, a),
		setReplayKey: fmt.Sprintf("UPDATE %s SET replay_key = $2 WHERE id = $1", a),
		remove: fmt.Sprintf(`DELETE FROM %s
WHERE id = ANY(string_to_array($1::text, ',')::bigint[]) AND kind = ANY(string_to_array($2::text, ','))
RETURNING id`, o),
		counts: fmt.Sprintf(`SELECT consumer, kind, COALESCE(payload->>'source_topic', payload->>'source_stream', NULLIF(payload->>'source', ''), payload->>'source_key', ''), count(*)
FROM %s WHERE kind = ANY(string_to_array($1::text, ','))
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`, o),
		history: fmt.Sprintf(`SELECT id, action, actor, at, COALESCE(replay_kind, ''), COALESCE(replay_key, ''), COALESCE(reason, '')
FROM %s WHERE dead_letter_id = $1 ORDER BY id`, a),
	}
}
