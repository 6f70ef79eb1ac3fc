DROP TABLE IF EXISTS "kafka_offsets";
