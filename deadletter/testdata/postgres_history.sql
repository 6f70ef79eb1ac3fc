SELECT id, action, actor, at, COALESCE(replay_kind, ''), COALESCE(replay_key, ''), COALESCE(reason, '')
FROM "app"."outbox_dead_letter_audit" WHERE dead_letter_id = $1 ORDER BY id
