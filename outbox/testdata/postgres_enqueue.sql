INSERT INTO "app"."outbox" (consumer, message_key, kind, idempotency_key, payload, event_time, event_time_ns,
		trace_parent, trace_state, baggage, order_key, order_seq)
	VALUES ($1, $2, $3, $4, $5::json, $6, $7, $8, $9, $10, $11, $12)
	ON CONFLICT (kind, idempotency_key) DO NOTHING
	RETURNING id
