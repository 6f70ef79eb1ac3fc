DROP TABLE IF EXISTS "processed_messages", "processed_messages_horizon";
