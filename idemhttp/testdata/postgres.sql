-- SchemaSQL up
-- Response table of github.com/txclaim/idempotent/idemhttp: the stored response
-- of each claimed request, keyed like its claim, replayed to the request's retries.
CREATE TABLE IF NOT EXISTS "shop"."processed_messages_http" (
	consumer    text    NOT NULL,
	message_key text    NOT NULL,
	fingerprint bytea   NOT NULL,
	status      integer NOT NULL,
	header      bytea   NOT NULL,
	body        bytea   NOT NULL,
	created_at  bigint  NOT NULL,
	PRIMARY KEY (consumer, message_key)
);
CREATE INDEX IF NOT EXISTS "processed_messages_http_created" ON "shop"."processed_messages_http" (created_at);

-- SchemaSQL down
DROP TABLE IF EXISTS "shop"."processed_messages_http";

-- put, get, cleanup, stats
INSERT INTO "shop"."processed_messages_http" (consumer, message_key, fingerprint, status, header, body, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer, message_key) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status,
header = excluded.header, body = excluded.body, created_at = excluded.created_at;

SELECT fingerprint, status, header, body FROM "shop"."processed_messages_http" WHERE consumer = $1 AND message_key = $2;

DELETE FROM "shop"."processed_messages_http" WHERE (consumer, message_key) IN (
	SELECT x.consumer, x.message_key FROM "shop"."processed_messages_http" x WHERE x.created_at < $1
	AND NOT EXISTS (SELECT 1 FROM "shop"."processed_messages" c WHERE c.consumer = x.consumer AND c.message_key = x.message_key) LIMIT $2
) AND created_at < $1;

SELECT count(*), COALESCE(min(created_at), 0) FROM "shop"."processed_messages_http";

