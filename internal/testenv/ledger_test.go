package testenv

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lib/pq"
)

// recorder is a testing.TB that keeps what AuditLedger reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestAuditLedger: an exact schema passes; a doubled order, a missing claim,
// a wrong balance and a customer with no balance row are each reported.
func TestAuditLedger(t *testing.T) {
	db := OpenPostgres(t, 2)
	schema := UniqueName("audit")
	q := pq.QuoteIdentifier(schema)
	setup := fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL);
CREATE TABLE %[1]s.point_ledger (order_id bigint NOT NULL, customer_id bigint NOT NULL, points bigint NOT NULL);
CREATE TABLE %[1]s.processed_messages (consumer text, message_key text);
INSERT INTO %[1]s.balances VALUES (1, 10), (2, 5);
INSERT INTO %[1]s.point_ledger VALUES (1, 1, 10), (2, 2, 5);
INSERT INTO %[1]s.processed_messages VALUES ('c', '1'), ('c', '2');`, q)
	if _, err := db.Exec(setup); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA " + q + " CASCADE") })

	audit := func(want map[int64]int64) []string {
		r := &recorder{TB: t}
		AuditLedger(r, db, schema, 2, want)
		return r.errs
	}
	if errs := audit(map[int64]int64{1: 10, 2: 5}); len(errs) != 0 {
		t.Fatalf("exact tables reported: %v", errs)
	}
	errs := strings.Join(audit(map[int64]int64{1: 10, 2: 6, 3: 7}), "\n")
	for _, s := range []string{"customer 2 has 5 points, want 6", "customer 3 has 0 points, want 7", "2 balances wrong"} {
		if !strings.Contains(errs, s) {
			t.Errorf("wrong balances: report %q lacks %q", errs, s)
		}
	}
	if _, err := db.Exec("INSERT INTO " + q + ".point_ledger VALUES (2, 2, 5); DELETE FROM " + q + ".processed_messages WHERE message_key = '2'"); err != nil {
		t.Fatal(err)
	}
	errs = strings.Join(audit(map[int64]int64{1: 10, 2: 5}), "\n")
	for _, s := range []string{"3 ledger rows, want 2", "1 orders applied more than once", "1 claims, want 2"} {
		if !strings.Contains(errs, s) {
			t.Errorf("doubled order and missing claim: report %q lacks %q", errs, s)
		}
	}
}
