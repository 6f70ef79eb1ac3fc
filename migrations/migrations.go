// Package migrations ships the Postgres claim table of
// github.com/txclaim/idempotent as migration files, for teams whose schema
// changes go through a migration tool rather than EnsureSchema.
//
// [FS] holds four directories, each with a migration that creates (up) and
// drops (down) the default table, processed_messages:
//
//	goose/                       goose, plain table
//	goose-partitioned/           goose, partitioned by event day
//	golang-migrate/              golang-migrate, plain table
//	golang-migrate-partitioned/  golang-migrate, partitioned by event day
//
// Each directory also holds a second migration creating kafka_offsets, the
// offsets table of the github.com/txclaim/idempotent/kafka consumer (see
// its SchemaSQL); it is empty and unused without that consumer.
//
// With goose:
//
//	goose.SetBaseFS(migrations.FS)
//	err := goose.Up(db, migrations.GooseDir)
//
// With golang-migrate:
//
//	src, err := iofs.New(migrations.FS, migrations.GolangMigrateDir)
//	m, err := migrate.NewWithSourceInstance("iofs", src, databaseURL)
//	err = m.Up()
//
// For another table name, render the files with [SQL], [GooseFile] and
// [GolangMigrateFiles] (or the idempotent CLI's "schema" command) and add
// them to your own migrations. The partitioned table is created without
// partitions: run MaintainPartitions (or "idempotent partitions") after the
// migration, and daily.
//
// Neither tool is a dependency of this module: the files only follow their
// formats.
package migrations

import (
	"embed"
	"fmt"
	"strings"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// FS holds the migration files for the default table; see the package
// documentation for its directories.
//
//go:embed goose goose-partitioned golang-migrate golang-migrate-partitioned
var FS embed.FS

// Directories of FS.
const (
	// GooseDir holds the goose migration of the plain table.
	GooseDir = "goose"
	// GoosePartitionedDir holds the goose migration of the partitioned table.
	GoosePartitionedDir = "goose-partitioned"
	// GolangMigrateDir holds the golang-migrate migration of the plain table.
	GolangMigrateDir = "golang-migrate"
	// GolangMigratePartitionedDir holds the golang-migrate migration of the
	// partitioned table.
	GolangMigratePartitionedDir = "golang-migrate-partitioned"
)

// DefaultTable is the table the files in FS create; it is the idempotent
// package's default.
const DefaultTable = "processed_messages"

// SQL returns the Postgres DDL that creates (up) and drops (down) the claim
// table named table ("table" or "schema.table"), plain or partitioned by
// event day. It is the DDL EnsureSchema runs, less the lock EnsureSchema takes
// to let processes start together.
func SQL(table string, partitioned bool) (up, down string, err error) {
	t, err := dialect.ParseTable(table)
	if err != nil {
		return "", "", fmt.Errorf("migrations: %w", err)
	}
	var b strings.Builder
	if partitioned {
		fmt.Fprintf(&b, "-- Claim table of github.com/txclaim/idempotent, partitioned by the UTC day of\n")
		fmt.Fprintf(&b, "-- each message's event time. It has no partition yet: run MaintainPartitions\n")
		fmt.Fprintf(&b, "-- (or `idempotent partitions`) after this migration, and daily.\n")
	} else {
		fmt.Fprintf(&b, "-- Claim table of github.com/txclaim/idempotent, with the processed_at index\n")
		fmt.Fprintf(&b, "-- that Cleanup walks.\n")
	}
	for _, s := range postgres.TableDDL(t, partitioned) {
		b.WriteString(s)
		b.WriteString(";\n")
	}
	return b.String(), postgres.DropTableDDL(t) + ";\n", nil
}

// GooseFile returns one goose migration file (annotated "-- +goose Up" and
// "-- +goose Down") for the claim table named table.
func GooseFile(table string, partitioned bool) (string, error) {
	up, down, err := SQL(table, partitioned)
	if err != nil {
		return "", err
	}
	return "-- +goose Up\n" + up + "\n-- +goose Down\n" + down, nil
}

// GolangMigrateFiles returns the contents of a golang-migrate pair of files
// (NNN_name.up.sql and NNN_name.down.sql) for the claim table named table.
func GolangMigrateFiles(table string, partitioned bool) (up, down string, err error) {
	return SQL(table, partitioned)
}

// DefaultKafkaOffsetsTable is the offsets table the files in FS create for
// the github.com/txclaim/idempotent/kafka consumer; it is that package's
// default.
const DefaultKafkaOffsetsTable = "kafka_offsets"

// KafkaOffsetsSQL returns the Postgres DDL that creates (up) and drops
// (down) the offsets table of the github.com/txclaim/idempotent/kafka
// consumer named table ("table" or "schema.table"): one row per (consumer,
// topic, partition) holding the offset of the next record to apply and the
// Kafka topic ID the offset belongs to (NULL until a fetch reports one), so
// that a topic deleted and re-created under the same name is told from the
// one the offset was stored for. It is the DDL of the files in FS, of
// kafka.SchemaSQL and kafka.EnsureSchema, and of the CLI's
// "schema -kafka-offsets" and "migrate -kafka-offsets".
func KafkaOffsetsSQL(table string) (up, down string, err error) {
	t, err := dialect.ParseTable(table)
	if err != nil {
		return "", "", fmt.Errorf("migrations: kafka offsets table: %w", err)
	}
	q := t.Quoted(quoteIdent)
	up = `-- Offsets table of github.com/txclaim/idempotent/kafka: the next offset to apply
-- of each (consumer, topic, partition), advanced in the claim's transaction.
CREATE TABLE IF NOT EXISTS ` + q + ` (
	consumer    text        NOT NULL,
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	next_offset bigint      NOT NULL CHECK (next_offset >= 0),
	topic_id    text,
	updated_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, topic, partition)
);
`
	return up, `DROP TABLE IF EXISTS ` + q + ";\n", nil
}

// KafkaOffsetsGooseFile is GooseFile for the kafka consumer's offsets table.
func KafkaOffsetsGooseFile(table string) (string, error) {
	up, down, err := KafkaOffsetsSQL(table)
	if err != nil {
		return "", err
	}
	return "-- +goose Up\n" + up + "\n-- +goose Down\n" + down, nil
}

// quoteIdent quotes a Postgres identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// FileBase returns the name, without version or extension, that the files
// in FS use for a migration of table: "create_" followed by the table name,
// dots replaced by underscores.
func FileBase(table string) string {
	return "create_" + strings.ReplaceAll(table, ".", "_")
}
