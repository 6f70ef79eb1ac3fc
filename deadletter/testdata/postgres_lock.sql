SELECT id, consumer, kind, message_key, idempotency_key, payload::text, state, attempts,
	created_at, event_time, event_time_ns, last_error, sent_at, dead_at
FROM "app"."outbox"
WHERE kind = ANY(string_to_array($1::text, ','))
	AND ($2::text IS NULL OR consumer = $2::text)
	AND ($3::text IS NULL OR COALESCE(payload->>'source_topic', payload->>'source_stream', NULLIF(payload->>'source', ''), payload->>'source_key') = $3::text)
	AND ($4::text IS NULL OR message_key = $4::text)
	AND ($5::text IS NULL OR strpos(payload->>'error', $5::text) > 0)
	AND ($6::timestamptz IS NULL OR created_at >= $6::timestamptz)
	AND ($7::timestamptz IS NULL OR created_at < $7::timestamptz)
	AND ($8::text IS NULL OR id = ANY(string_to_array($8::text, ',')::bigint[]))
	AND id > $9
ORDER BY id
LIMIT $10
FOR UPDATE
