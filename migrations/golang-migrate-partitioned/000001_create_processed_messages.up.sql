-- Claim table of github.com/txclaim/idempotent, partitioned by the UTC day of
-- each message's event time. It has no partition yet: run MaintainPartitions
-- (or `idempotent partitions`) after this migration, and daily.
CREATE TABLE IF NOT EXISTS "processed_messages" (
	consumer     text        NOT NULL,
	message_key  text        NOT NULL,
	event_day    date        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_key, event_day)
) PARTITION BY RANGE (event_day);
CREATE TABLE IF NOT EXISTS "processed_messages_horizon" (
	consumer         text        PRIMARY KEY,
	forgotten_before timestamptz NOT NULL
);
