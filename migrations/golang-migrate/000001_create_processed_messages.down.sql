DROP TABLE IF EXISTS "processed_messages";
