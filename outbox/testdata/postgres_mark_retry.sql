UPDATE "app"."outbox"
SET next_attempt_at = now() + ($4::bigint[])[array_position($1::bigint[], id)]::bigint * interval '1 millisecond', lease_owner = NULL, lease_expires_at = NULL,
	last_error = ($5::text[])[array_position($1::bigint[], id)]
WHERE id = ANY($1::bigint[]) AND lease_owner = $2 AND state = 'pending'
	AND attempts = ($3::integer[])[array_position($1::bigint[], id)]
RETURNING id
