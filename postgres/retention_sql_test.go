package postgres

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
)

var updateRetention = flag.Bool("update-retention", false, "rewrite testdata/retention.golden")

// TestRetentionSQLGolden pins every statement of the Cleaner and
// Partitioner interfaces, and StatsSQL.
func TestRetentionSQLGolden(t *testing.T) {
	d := New()
	tab := dialect.Table{Schema: "app", Name: "claims"}
	bare := dialect.Table{Name: "processed_messages"}
	day := time.Date(2031, 3, 14, 23, 0, 0, 0, time.FixedZone("UTC-3", -3*3600)) // 15 March in UTC
	var b strings.Builder
	add := func(name string, v any) { fmt.Fprintf(&b, "-- %s\n%v\n\n", name, v) }
	withArgs := func(q string, args []any) string { return fmt.Sprintf("%s\n%v", q, args) }
	cutoff := time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC)
	add("CleanupLockSQL", withArgs(d.CleanupLockSQL(tab)))
	add("StatementTimeoutSQL(1500ms)", d.StatementTimeoutSQL(1500*time.Millisecond))
	add("StatementTimeoutSQL(1µs)", d.StatementTimeoutSQL(time.Microsecond))
	add("CleanupBatchSQL(consumer)", withArgs(d.CleanupBatchSQL(tab, "billing", cutoff, 500)))
	add("CleanupBatchSQL(all)", withArgs(d.CleanupBatchSQL(tab, "", cutoff, 500)))
	add("CountExpiredSQL(consumer)", withArgs(d.CountExpiredSQL(tab, "billing", cutoff)))
	add("CountExpiredSQL(all)", withArgs(d.CountExpiredSQL(tab, "", cutoff)))
	add("HorizonTable", d.HorizonTable(tab))
	add("HorizonSchemaSQL", strings.Join(d.HorizonSchemaSQL(tab), ";\n"))
	add("AdvanceHorizonSQL(consumer)", withArgs(d.AdvanceHorizonSQL(tab, "billing", cutoff)))
	add("AdvanceHorizonSQL(all)", withArgs(d.AdvanceHorizonSQL(tab, "", cutoff)))
	add("HorizonSQL", withArgs(d.HorizonSQL(tab, "billing")))
	add("HorizonsSQL", d.HorizonsSQL(tab))
	add("HorizonClaimSQL(plain)", d.HorizonClaimSQL(tab, false))
	add("HorizonClaimSQL(partitioned)", d.HorizonClaimSQL(tab, true))
	add("OlderSnapshotsSQL", withArgs(d.OlderSnapshotsSQL(tab, "billing")))
	add("FoldHorizonClaimSQL(plain)", d.FoldHorizonClaimSQL(tab, false, "UPDATE app.offsets SET next = $5 WHERE id = $4"))
	add("FoldHorizonClaimSQL(partitioned)", d.FoldHorizonClaimSQL(tab, true, "UPDATE app.offsets SET next = $6 WHERE id = $5"))
	add("FoldHorizonClaimSQL(no companion)", d.FoldHorizonClaimSQL(tab, false, ""))
	add("HorizonName(long)", HorizonName(strings.Repeat("x", 60)))
	add("StatsSQL", d.StatsSQL(tab))
	add("PartitionedSchemaSQL", strings.Join(d.PartitionedSchemaSQL(tab), ";\n"))
	q, args := d.TableKindSQL(tab)
	add("TableKindSQL", fmt.Sprintf("%s\n%q", q, args))
	add("ClaimAtSQL", d.ClaimAtSQL(tab))
	add("PartitionName", d.PartitionName(tab, day))
	q, args = d.ListPartitionsSQL(bare)
	add("ListPartitionsSQL", fmt.Sprintf("%s\n%q", q, args))
	add("MaintenanceLockSQL", d.MaintenanceLockSQL(tab))
	add("CreatePartitionSQL", d.CreatePartitionSQL(tab, day))
	add("CreatePartitionSQL(31 Dec)", d.CreatePartitionSQL(bare, time.Date(2031, 12, 31, 0, 0, 0, 0, time.UTC)))
	add("DetachPartitionSQL", d.DetachPartitionSQL(tab, "claims_p20310315"))
	add("DropPartitionSQL", d.DropPartitionSQL(tab, "claims_p20310315"))
	add("TableDDL(plain)", strings.Join(TableDDL(tab, false), ";\n"))
	add("DropTableDDL", DropTableDDL(tab))
	got := b.String()
	const file = "testdata/retention.golden"
	if *updateRetention {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("SQL differs from %s (run go test ./postgres -update-retention after checking):\n%s", file, got)
	}
}

func TestRetentionErrorCodes(t *testing.T) {
	d := New()
	wrap := func(code string) error { return fmt.Errorf("claim: %w", &pq.Error{Code: pq.ErrorCode(code)}) }
	if !d.IsNoPartition(wrap("23514")) || d.IsNoPartition(wrap("23505")) || d.IsNoPartition(errors.New("23514")) {
		t.Error("IsNoPartition")
	}
	if !d.IsStatementTimeout(wrap("57014")) || d.IsStatementTimeout(wrap("55P03")) || d.IsStatementTimeout(nil) {
		t.Error("IsStatementTimeout")
	}
}

func TestTableDDLIsSchemaSQLWithoutTheLock(t *testing.T) {
	tab := dialect.Table{Name: "claims"}
	for _, partitioned := range []bool{false, true} {
		all := New().SchemaSQL(tab)
		if partitioned {
			all = New().PartitionedSchemaSQL(tab)
		}
		if !strings.HasPrefix(all[0], "SELECT pg_advisory_xact_lock(") {
			t.Fatalf("first statement is not the lock: %s", all[0])
		}
		if fmt.Sprint(TableDDL(tab, partitioned)) != fmt.Sprint(all[1:]) {
			t.Fatalf("partitioned=%v: TableDDL differs", partitioned)
		}
	}
}
