package postgres

import (
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

// TableDDL returns the statements that create the claim table t if it does
// not exist — plain (SchemaSQL's table and processed_at index) or
// partitioned by event day (PartitionedSchemaSQL's table) — and its horizon
// table (HorizonSchemaSQL), without the advisory lock EnsureSchema takes
// first. It is the form a migration tool runs; the migrations package ships
// it as files.
func TableDDL(t dialect.Table, partitioned bool) []string {
	if partitioned {
		return New().PartitionedSchemaSQL(t)[1:]
	}
	return New().SchemaSQL(t)[1:]
}

// DropTableDDL returns the statement that drops the claim table t (and, when
// it is partitioned, all its attached partitions).
func DropTableDDL(t dialect.Table) string {
	return fmt.Sprintf("DROP TABLE IF EXISTS %s, %s", quote(t), New().horizon(t))
}
