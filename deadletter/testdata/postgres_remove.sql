DELETE FROM "app"."outbox"
WHERE id = ANY(string_to_array($1::text, ',')::bigint[]) AND kind = ANY(string_to_array($2::text, ','))
RETURNING id
