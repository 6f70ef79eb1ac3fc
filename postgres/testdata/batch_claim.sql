INSERT INTO "loyalty"."processed_messages" (consumer, message_key) SELECT $1, k FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i ON CONFLICT DO NOTHING RETURNING message_key
