INSERT INTO "app"."outbox_dead_letter_audit" (dead_letter_id, consumer, kind, message_key, action, actor, reason, replay_kind)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id, at
