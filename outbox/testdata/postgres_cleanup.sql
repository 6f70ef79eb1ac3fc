DELETE FROM "app"."outbox"
WHERE state = 'sent' AND sent_at < now() - $1::bigint * interval '1 millisecond'
	AND ctid IN (SELECT ctid FROM "app"."outbox" WHERE state = 'sent' AND sent_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2)
