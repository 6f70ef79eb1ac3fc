-- SchemaSQL up
-- Response table of github.com/txclaim/idempotent/idemhttp: the stored response
-- of each claimed request, keyed like its claim, replayed to the request's retries.
CREATE TABLE IF NOT EXISTS "shop"."processed_messages_http" (
	consumer    TEXT    NOT NULL,
	message_key TEXT    NOT NULL,
	fingerprint BLOB    NOT NULL,
	status      INTEGER NOT NULL,
	header      BLOB    NOT NULL,
	body        BLOB    NOT NULL,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (consumer, message_key)
);
CREATE INDEX IF NOT EXISTS "shop"."processed_messages_http_created" ON "processed_messages_http" (created_at);

-- SchemaSQL down
DROP TABLE IF EXISTS "shop"."processed_messages_http";

-- put, get, cleanup, stats
INSERT INTO "shop"."processed_messages_http" (consumer, message_key, fingerprint, status, header, body, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (consumer, message_key) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status,
header = excluded.header, body = excluded.body, created_at = excluded.created_at;

SELECT fingerprint, status, header, body FROM "shop"."processed_messages_http" WHERE consumer = ? AND message_key = ?;

DELETE FROM "shop"."processed_messages_http" WHERE rowid IN (
	SELECT x.rowid FROM "shop"."processed_messages_http" x WHERE x.created_at < ?
	AND NOT EXISTS (SELECT 1 FROM "shop"."processed_messages" c WHERE c.consumer = x.consumer AND c.message_key = x.message_key) LIMIT ?
);

SELECT count(*), COALESCE(min(created_at), 0) FROM "shop"."processed_messages_http";

