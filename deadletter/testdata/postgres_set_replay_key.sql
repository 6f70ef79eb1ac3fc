UPDATE "app"."outbox_dead_letter_audit" SET replay_key = $2 WHERE id = $1
