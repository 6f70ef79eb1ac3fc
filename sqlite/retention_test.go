package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
)

// TestRetentionSQLGolden pins every statement of the Cleaner, HorizonKeeper
// and StatsReader interfaces in testdata/retention.golden. Run `go test
// ./sqlite -run TestRetentionSQLGolden -update` after an intended change,
// and review the diff.
func TestRetentionSQLGolden(t *testing.T) {
	d := New()
	tab := dialect.Table{Schema: "main", Name: "claims"}
	cutoff := time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	add := func(name string, v any) { fmt.Fprintf(&b, "-- %s\n%v\n\n", name, v) }
	withArgs := golden.Statement
	add("CleanupLockSQL", withArgs(d.CleanupLockSQL(tab)))
	add("StatementTimeoutSQL(1500ms)", fmt.Sprintf("%q", d.StatementTimeoutSQL(1500*time.Millisecond)))
	add("CleanupBatchSQL(consumer)", withArgs(d.CleanupBatchSQL(tab, "billing", cutoff, 500)))
	add("CleanupBatchSQL(all)", withArgs(d.CleanupBatchSQL(tab, "", cutoff.Add(500*time.Microsecond), 500)))
	add("CountExpiredSQL(consumer)", withArgs(d.CountExpiredSQL(tab, "billing", cutoff)))
	add("CountExpiredSQL(all)", withArgs(d.CountExpiredSQL(tab, "", cutoff)))
	add("StatsSQL", d.StatsSQL(tab))
	add("HorizonTable", d.HorizonTable(tab))
	add("HorizonSchemaSQL", strings.Join(d.HorizonSchemaSQL(tab), ";\n"))
	add("AdvanceHorizonSQL(consumer)", withArgs(d.AdvanceHorizonSQL(tab, "billing", cutoff)))
	add("AdvanceHorizonSQL(all)", withArgs(d.AdvanceHorizonSQL(tab, "", cutoff.Add(123456789))))
	add("HorizonSQL", withArgs(d.HorizonSQL(tab, "billing")))
	add("HorizonsSQL", d.HorizonsSQL(tab))
	golden.Compare(t, filepath.Join("testdata", "retention.golden"), b.String())
}

func TestTimeTextComparesAsTheTimesDo(t *testing.T) {
	base := time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[time.Time]string{
		base:                                    "2031-02-01 12:00:00.000",
		base.Add(123 * time.Millisecond):        "2031-02-01 12:00:00.123",
		base.Add(500 * time.Microsecond):        "2031-02-01 12:00:00.0005",
		base.Add(123456 * time.Microsecond):     "2031-02-01 12:00:00.123456",
		base.Add(time.Nanosecond):               "2031-02-01 12:00:00.000001",
		base.In(time.FixedZone("x", -5*3600)):   "2031-02-01 12:00:00.000",
		base.Add(-time.Nanosecond):              "2031-02-01 12:00:00.000",
		base.Add(999_999_999 * time.Nanosecond): "2031-02-01 12:00:01.000",
	} {
		if got := timeText(in); got != want {
			t.Errorf("timeText(%v) = %q, want %q", in, got, want)
		}
	}
	// Text order is time order against what the column's default writes
	// (milliseconds), around a cutoff with sub-millisecond digits.
	cutoff := timeText(base.Add(1500 * time.Microsecond))
	for ms, before := range map[int]bool{0: true, 1: true, 2: false, 3: false} {
		stamped := base.Add(time.Duration(ms) * time.Millisecond).Format("2006-01-02 15:04:05.000")
		if (stamped < cutoff) != before {
			t.Errorf("%q < %q is %v, want %v", stamped, cutoff, stamped < cutoff, before)
		}
	}
}

// TestMicrosReadsStoredTimesExactly reads back, through SQLite, times
// written as the column's default writes them and as timeText writes them.
func TestMicrosReadsStoredTimesExactly(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "micros.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, tm := range []time.Time{
		time.Date(2031, 2, 1, 12, 0, 0, 0, time.UTC),
		time.Date(2031, 2, 1, 12, 0, 0, 123_000_000, time.UTC),
		time.Date(2031, 2, 1, 12, 0, 0, 123_456_000, time.UTC),
		time.Date(2031, 2, 1, 12, 0, 0, 500_000, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 500_000_000, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_000, time.UTC),
	} {
		var got sql.NullInt64
		if err := db.QueryRowContext(context.Background(), "SELECT "+micros("?1"), timeText(tm)).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if !got.Valid || got.Int64 != tm.UnixMicro() {
			t.Errorf("micros(%q) = %v, want %d", timeText(tm), got, tm.UnixMicro())
		}
	}
	var got sql.NullInt64
	if err := db.QueryRow("SELECT " + micros("NULL")).Scan(&got); err != nil || got.Valid {
		t.Errorf("micros(NULL) = %v, %v; want NULL", got, err)
	}
}
