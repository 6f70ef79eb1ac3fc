package idemhttp_test

import (
	"fmt"
	"log"

	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/postgres"
)

// The response table's DDL, for a migration tool (goose, golang-migrate,
// Atlas…), beside the claim table's own migration.
func ExampleSchemaSQL() {
	up, down, err := idemhttp.SchemaSQL(postgres.New(), "processed_messages_http")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(up)
	fmt.Print(down)
	// Output:
	// -- Response table of github.com/txclaim/idempotent/idemhttp: the stored response
	// -- of each claimed request, keyed like its claim, replayed to the request's retries.
	// CREATE TABLE IF NOT EXISTS "processed_messages_http" (
	// 	consumer    text    NOT NULL,
	// 	message_key text    NOT NULL,
	// 	fingerprint bytea   NOT NULL,
	// 	status      integer NOT NULL,
	// 	header      bytea   NOT NULL,
	// 	body        bytea   NOT NULL,
	// 	created_at  bigint  NOT NULL,
	// 	PRIMARY KEY (consumer, message_key)
	// );
	// CREATE INDEX IF NOT EXISTS "processed_messages_http_created" ON "processed_messages_http" (created_at);
	// DROP TABLE IF EXISTS "processed_messages_http";
}
