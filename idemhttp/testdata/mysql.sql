-- SchemaSQL up
-- Response table of github.com/txclaim/idempotent/idemhttp: the stored response
-- of each claimed request, keyed like its claim, replayed to the request's retries.
CREATE TABLE IF NOT EXISTS `shop`.`processed_messages_http` (
	consumer    VARBINARY(128)  NOT NULL,
	message_key VARBINARY(1024) NOT NULL,
	fingerprint VARBINARY(64)   NOT NULL,
	status      INT             NOT NULL,
	header      LONGBLOB        NOT NULL,
	body        LONGBLOB        NOT NULL,
	created_at  BIGINT          NOT NULL,
	PRIMARY KEY (consumer, message_key),
	KEY `processed_messages_http_created` (created_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC;

-- SchemaSQL down
DROP TABLE IF EXISTS `shop`.`processed_messages_http`;

-- put, get, cleanup, stats
INSERT INTO `shop`.`processed_messages_http` (consumer, message_key, fingerprint, status, header, body, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), status = VALUES(status),
header = VALUES(header), body = VALUES(body), created_at = VALUES(created_at);

SELECT fingerprint, status, header, body FROM `shop`.`processed_messages_http` WHERE consumer = ? AND message_key = ?;

DELETE FROM `shop`.`processed_messages_http` WHERE created_at < ?
AND NOT EXISTS (SELECT 1 FROM `shop`.`processed_messages` c WHERE c.consumer = `shop`.`processed_messages_http`.consumer AND c.message_key = `shop`.`processed_messages_http`.message_key) LIMIT ?;

SELECT count(*), COALESCE(min(created_at), 0) FROM `shop`.`processed_messages_http`;

-- upgrade of a table made by an earlier version: header type, lock wait, widen
SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = 'header';

SET SESSION lock_wait_timeout = 5;

ALTER TABLE `shop`.`processed_messages_http` MODIFY header LONGBLOB NOT NULL;

