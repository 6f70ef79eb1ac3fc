SELECT count(*),
	count(*) FILTER (WHERE lease_expires_at > now()),
	COALESCE((EXTRACT(EPOCH FROM now() - min(created_at)) * 1000)::bigint, 0),
	(SELECT count(*) FROM "app"."outbox" WHERE state = 'dead')
FROM "app"."outbox" WHERE state = 'pending'
