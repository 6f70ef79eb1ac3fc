package mysql

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// TestRetentionSQLGolden pins every statement of the Cleaner, LockReleaser,
// HorizonKeeper, StatsReader and Partitioner interfaces in
// testdata/retention.golden. Run `go test ./mysql -run TestRetentionSQLGolden
// -update` after an intended change, and review the diff.
func TestRetentionSQLGolden(t *testing.T) {
	d := New()
	tab := dialect.Table{Schema: "shop", Name: "claims"}
	bare := dialect.Table{Name: "processed_messages"}
	day := time.Date(2031, 3, 14, 23, 0, 0, 0, time.FixedZone("UTC-3", -3*3600)) // 15 March in UTC
	cutoff := time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	add := func(name string, v any) { fmt.Fprintf(&b, "-- %s\n%v\n\n", name, v) }
	withArgs := golden.Statement
	add("CleanupLockSQL", withArgs(d.CleanupLockSQL(tab)))
	add("CleanupLockSQL(unqualified)", withArgs(d.CleanupLockSQL(bare)))
	add("ReleaseCleanupSQL", withArgs(d.ReleaseCleanupSQL(tab)))
	add("StatementTimeoutSQL(1500ms)", d.StatementTimeoutSQL(1500*time.Millisecond))
	add("StatementTimeoutSQL(1ns)", d.StatementTimeoutSQL(time.Nanosecond))
	add("StatementTimeoutSQL(90s)", d.StatementTimeoutSQL(90*time.Second))
	add("CleanupBatchSQL(consumer)", withArgs(d.CleanupBatchSQL(tab, "billing", cutoff, 500)))
	add("CleanupBatchSQL(all)", withArgs(d.CleanupBatchSQL(tab, "", cutoff, 500)))
	add("CountExpiredSQL(consumer)", withArgs(d.CountExpiredSQL(tab, "billing", cutoff)))
	add("CountExpiredSQL(all)", withArgs(d.CountExpiredSQL(tab, "", cutoff)))
	add("StatsSQL", d.StatsSQL(tab))
	add("HorizonTable", d.HorizonTable(tab))
	add("HorizonName(long)", HorizonName(strings.Repeat("x", 63)))
	add("HorizonSchemaSQL", strings.Join(d.HorizonSchemaSQL(tab), ";\n"))
	add("AdvanceHorizonSQL(consumer)", withArgs(d.AdvanceHorizonSQL(tab, "billing", cutoff)))
	add("AdvanceHorizonSQL(all)", withArgs(d.AdvanceHorizonSQL(tab, "", cutoff.Add(time.Nanosecond))))
	add("HorizonSQL", withArgs(d.HorizonSQL(tab, "billing")))
	add("HorizonsSQL", d.HorizonsSQL(tab))
	add("PartitionedSchemaSQL", strings.Join(d.PartitionedSchemaSQL(tab), ";\n"))
	add("TableKindSQL", withArgs(d.TableKindSQL(tab)))
	add("TableKindSQL(unqualified)", withArgs(d.TableKindSQL(bare)))
	add("ClaimAtSQL", d.ClaimAtSQL(tab))
	add("PartitionName", d.PartitionName(tab, day))
	add("ListPartitionsSQL", withArgs(d.ListPartitionsSQL(bare)))
	add("MaintenanceLockSQL", d.MaintenanceLockSQL(tab))
	add("ReleaseMaintenanceSQL", withArgs(d.ReleaseMaintenanceSQL(tab)))
	add("CreatePartitionSQL", d.CreatePartitionSQL(tab, day))
	add("CreatePartitionSQL(31 Dec)", d.CreatePartitionSQL(bare, time.Date(2031, 12, 31, 0, 0, 0, 0, time.UTC)))
	add("DetachPartitionSQL", fmt.Sprintf("%q", d.DetachPartitionSQL(tab, "p20310315")))
	add("DropPartitionSQL", d.DropPartitionSQL(tab, "p20310315"))
	golden.Compare(t, filepath.Join("testdata", "retention.golden"), b.String())
}

func TestTimeArgRoundsUpToTheMicrosecond(t *testing.T) {
	base := time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[time.Time]string{
		base:                               "2031-02-01 12:00:00.000000",
		base.Add(time.Nanosecond):          "2031-02-01 12:00:00.000001",
		base.Add(time.Microsecond):         "2031-02-01 12:00:00.000001",
		base.Add(time.Microsecond + 1):     "2031-02-01 12:00:00.000002",
		base.Add(-time.Nanosecond):         "2031-02-01 12:00:00.000000",
		base.In(time.FixedZone("x", 7200)): "2031-02-01 12:00:00.000000", // UTC whatever the zone
	} {
		if got := timeArg(in); got != want {
			t.Errorf("timeArg(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestLiteral(t *testing.T) {
	for in, want := range map[string]string{"claims": "'claims'", "a'b": "X'612762'", `a\`: "X'615c'"} {
		if got := literal(in); got != want {
			t.Errorf("literal(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestRetentionErrorNumbers(t *testing.T) {
	d := New()
	wrap := func(n uint16) error { return fmt.Errorf("batch: %w", &mysql.MySQLError{Number: n}) }
	if !d.IsStatementTimeout(wrap(1969)) || !d.IsStatementTimeout(wrap(3024)) || d.IsStatementTimeout(wrap(1205)) ||
		d.IsStatementTimeout(errors.New("1969")) || d.IsStatementTimeout(nil) {
		t.Error("IsStatementTimeout")
	}
	if !d.IsNoPartition(wrap(1526)) || d.IsNoPartition(wrap(1517)) || d.IsNoPartition(errors.New("1526")) {
		t.Error("IsNoPartition")
	}
}

func TestHorizonNameFitsMySQLIdentifiers(t *testing.T) {
	for _, n := range []int{1, 56, 57, 63} {
		name := strings.Repeat("n", n)
		h := HorizonName(name)
		if len(h) > MaxIdentifierLength || !strings.HasSuffix(h, "_horizon") {
			t.Errorf("HorizonName of %d bytes = %q (%d bytes)", n, h, len(h))
		}
		if n <= 56 && h != name+"_horizon" {
			t.Errorf("HorizonName(%q) = %q, want the plain suffix", name, h)
		}
	}
	if HorizonName(strings.Repeat("a", 62)+"b") == HorizonName(strings.Repeat("a", 62)+"c") {
		t.Error("two long names sharing a prefix share a horizon table")
	}
}
