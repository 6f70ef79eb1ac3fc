-- +goose Up
-- Offsets table of github.com/txclaim/idempotent/kafka: the next offset to apply
-- of each (consumer, topic, partition), advanced in the claim's transaction.
CREATE TABLE IF NOT EXISTS "kafka_offsets" (
	consumer    text        NOT NULL,
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	next_offset bigint      NOT NULL CHECK (next_offset >= 0),
	topic_id    text,
	updated_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, topic, partition)
);

-- +goose Down
DROP TABLE IF EXISTS "kafka_offsets";
