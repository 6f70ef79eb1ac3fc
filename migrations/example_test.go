package migrations_test

import (
	"fmt"
	"io/fs"
	"log"

	"github.com/txclaim/idempotent/migrations"
)

func ExampleSQL() {
	up, down, err := migrations.SQL("app.claims", false)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(up, down)
	// Output:
	// -- Claim table of github.com/txclaim/idempotent, with the processed_at index
	// -- that Cleanup walks.
	// CREATE TABLE IF NOT EXISTS "app"."claims" (
	// 	consumer     text        NOT NULL,
	// 	message_key  text        NOT NULL,
	// 	processed_at timestamptz NOT NULL DEFAULT now(),
	// 	PRIMARY KEY (consumer, message_key)
	// );
	// CREATE INDEX IF NOT EXISTS "claims_processed_at" ON "app"."claims" (processed_at);
	// CREATE TABLE IF NOT EXISTS "app"."claims_horizon" (
	// 	consumer         text        PRIMARY KEY,
	// 	forgotten_before timestamptz NOT NULL
	// );
	// DROP TABLE IF EXISTS "app"."claims", "app"."claims_horizon";
}

// The embedded files are what goose.SetBaseFS(migrations.FS) and
// iofs.New(migrations.FS, dir) read.
func ExampleFS() {
	for _, dir := range []string{migrations.GooseDir, migrations.GolangMigrateDir} {
		names, err := fs.Glob(migrations.FS, dir+"/*.sql")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(names)
	}
	// Output:
	// [goose/00001_create_processed_messages.sql goose/00002_create_kafka_offsets.sql]
	// [golang-migrate/000001_create_processed_messages.down.sql golang-migrate/000001_create_processed_messages.up.sql golang-migrate/000002_create_kafka_offsets.down.sql golang-migrate/000002_create_kafka_offsets.up.sql]
}
