UPDATE "app"."outbox"
SET attempts = attempts + 1,
	lease_owner = $3,
	lease_expires_at = now() + $4::bigint * interval '1 millisecond',
	next_attempt_at = now() + $4::bigint * interval '1 millisecond'
WHERE id = ANY(ARRAY(
	SELECT id FROM "app"."outbox"
	WHERE state = 'pending' AND next_attempt_at <= now() AND kind = ANY($1::text[])
	ORDER BY next_attempt_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))
RETURNING id, consumer, message_key, kind, idempotency_key, payload, attempts, created_at, event_time, event_time_ns,
	trace_parent, trace_state, baggage, order_key, order_seq
