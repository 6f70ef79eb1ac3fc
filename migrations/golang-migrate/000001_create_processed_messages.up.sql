-- Claim table of github.com/txclaim/idempotent, with the processed_at index
-- that Cleanup walks.
CREATE TABLE IF NOT EXISTS "processed_messages" (
	consumer     text        NOT NULL,
	message_key  text        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_key)
);
CREATE INDEX IF NOT EXISTS "processed_messages_processed_at" ON "processed_messages" (processed_at);
CREATE TABLE IF NOT EXISTS "processed_messages_horizon" (
	consumer         text        PRIMARY KEY,
	forgotten_before timestamptz NOT NULL
);
