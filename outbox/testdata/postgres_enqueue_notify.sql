WITH ins AS (
	INSERT INTO "app"."outbox" (consumer, message_key, kind, idempotency_key, payload)
	VALUES ($1, $2, $3, $4, $5::json)
	ON CONFLICT (kind, idempotency_key) DO NOTHING
	RETURNING id
)
SELECT id, pg_notify($6, '')::text FROM ins
