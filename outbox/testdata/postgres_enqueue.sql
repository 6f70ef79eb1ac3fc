INSERT INTO "app"."outbox" (consumer, message_key, kind, idempotency_key, payload, event_time, event_time_ns)
	VALUES ($1, $2, $3, $4, $5::json, $6, $7)
	ON CONFLICT (kind, idempotency_key) DO NOTHING
	RETURNING id
