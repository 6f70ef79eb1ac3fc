package golden

import (
	"strings"

	"github.com/txclaim/idempotent/dialect"
)

// Orderer renders every statement of a dialect.Orderer for the claim
// tables ts, for a golden file.
func Orderer(d dialect.Orderer, ts ...dialect.Table) string {
	var b strings.Builder
	for _, t := range ts {
		seq, parked := d.OrderTables(t)
		b.WriteString("-- table " + t.String() + ": sequence table " + seq.String() + ", parking table " + parked.String() + "\n")
		for _, s := range d.OrderSchemaSQL(t) {
			b.WriteString(s + ";\n")
		}
		for _, s := range []struct{ name, sql string }{
			{"advance", d.OrderAdvanceSQL(t)}, {"claim and advance", d.OrderClaimAdvanceSQL(t)}, {"row", d.OrderRowSQL(t)}, {"lock", d.OrderLockSQL(t)},
			{"bump", d.OrderBumpSQL(t)}, {"mark", d.OrderMarkSQL(t)},
			{"park", d.ParkSQL(t)}, {"skip", d.SkipSQL(t)}, {"parked", d.ParkedSQL(t)}, {"parked, locking", d.ParkedLockSQL(t)},
			{"unpark", d.UnparkSQL(t)}, {"unclaim", d.UnclaimSQL(t)}, {"waiting", d.WaitingSQL(t)},
			{"parked rows", d.ParkedRowsSQL(t)},
		} {
			b.WriteString("-- " + s.name + "\n" + s.sql + ";\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}
