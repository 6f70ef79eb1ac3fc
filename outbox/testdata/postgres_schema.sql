SELECT pg_advisory_xact_lock(7312228638527887985);

CREATE TABLE IF NOT EXISTS "app"."outbox" (
	id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	consumer         text        NOT NULL,
	message_key      text        NOT NULL,
	kind             text        NOT NULL,
	idempotency_key  text        NOT NULL,
	payload          json        NOT NULL,
	state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
	attempts         integer     NOT NULL DEFAULT 0,
	next_attempt_at  timestamptz NOT NULL DEFAULT now(),
	lease_owner      text,
	lease_expires_at timestamptz,
	last_error       text,
	created_at       timestamptz NOT NULL DEFAULT now(),
	event_time       timestamptz,
	event_time_ns    smallint,
	sent_at          timestamptz,
	dead_at          timestamptz,
	UNIQUE (idempotency_key, kind)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

ALTER TABLE "app"."outbox" ADD COLUMN IF NOT EXISTS event_time timestamptz;

ALTER TABLE "app"."outbox" ADD COLUMN IF NOT EXISTS event_time_ns smallint;

ALTER TABLE "app"."outbox" ADD COLUMN IF NOT EXISTS trace_parent text;

ALTER TABLE "app"."outbox" ADD COLUMN IF NOT EXISTS trace_state text;

ALTER TABLE "app"."outbox" ADD COLUMN IF NOT EXISTS baggage text;

ALTER TABLE "app"."outbox" ADD COLUMN IF NOT EXISTS order_key text;

ALTER TABLE "app"."outbox" ADD COLUMN IF NOT EXISTS order_seq bigint;

CREATE INDEX IF NOT EXISTS "outbox_due" ON "app"."outbox" (next_attempt_at) WHERE state = 'pending';

CREATE INDEX IF NOT EXISTS "outbox_sent_at" ON "app"."outbox" (sent_at) WHERE state = 'sent';

CREATE INDEX IF NOT EXISTS "outbox_dead_at" ON "app"."outbox" (dead_at) WHERE state = 'dead'
