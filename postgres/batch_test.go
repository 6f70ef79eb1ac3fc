package postgres

import (
	"database/sql/driver"
	"os"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
)

func TestBatchClaimSQLGolden(t *testing.T) {
	want, err := os.ReadFile("testdata/batch_claim.sql")
	if err != nil {
		t.Fatal(err)
	}
	got := New().BatchClaimSQL(dialect.Table{Schema: "loyalty", Name: "processed_messages"})
	if got != strings.TrimSuffix(string(want), "\n") {
		t.Fatalf("BatchClaimSQL:\n got %s\nwant %s", got, want)
	}
}

func TestBatchKeysArg(t *testing.T) {
	arg := New().BatchKeysArg([]string{"order-completed:1", `with "quotes", commas and \ backslash`, "NULL", ""})
	v, ok := arg.(driver.Valuer)
	if !ok {
		t.Fatalf("BatchKeysArg returned %T, want a driver.Valuer", arg)
	}
	got, err := v.Value()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"order-completed:1","with \"quotes\", commas and \\ backslash","NULL",""}`
	if got != want {
		t.Fatalf("encoded keys %v, want %s", got, want)
	}
}
