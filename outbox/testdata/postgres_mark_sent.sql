UPDATE "app"."outbox"
SET state = 'sent', sent_at = now(), lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
WHERE id = ANY($1::bigint[]) AND lease_owner = $2 AND state = 'pending'
	AND attempts = ($3::integer[])[array_position($1::bigint[], id)]
RETURNING id
