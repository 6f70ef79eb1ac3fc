SELECT pg_advisory_xact_lock(hashtext('idempotent:dead-letter-audit:app.outbox_dead_letter_audit'));

CREATE TABLE IF NOT EXISTS "app"."outbox_dead_letter_audit" (
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
);

CREATE INDEX IF NOT EXISTS "outbox_dead_letter_audit_dead_letter_id" ON "app"."outbox_dead_letter_audit" (dead_letter_id)
