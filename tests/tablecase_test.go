package tests

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// Table names with upper-case letters (issue 20, case 6); the conformance
// suite's BadTableNames check refuses them in every dialect.

// TestMixedCaseTableNameRefused is case 6 as a user meets it: a claim table
// created by hand as Processed_X (which Postgres folds to processed_x)
// already holds a claim; WithTable("…Processed_X") must be refused, not
// quoted into a second, empty table where that key applies again.
func TestMixedCaseTableNameRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openGuarded(t, "pq", 2)
	schema := tempSchema(t, db)
	if _, err := db.Exec(`CREATE TABLE ` + schema + `.Processed_X (
	consumer text NOT NULL, message_key text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_key))`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO ` + schema + `.Processed_X (consumer, message_key) VALUES ('loyalty', 'order-1')`); err != nil {
		t.Fatal(err)
	}
	name := schema + ".Processed_X"
	_, cerr := idempotent.NewClaimTable(db, postgres.New(), idempotent.WithTable(name))
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(name))
	for what, err := range map[string]error{"New": err, "NewClaimTable": cerr} {
		if !errors.Is(err, dialect.ErrInvalidIdentifier) || !strings.Contains(err.Error(), "upper-case letters") ||
			!strings.HasSuffix(err.Error(), "use "+schema+".processed_x") {
			t.Errorf("%s(WithTable(%q)) = %v, want ErrInvalidIdentifier saying the name has upper-case letters and to use %s.processed_x", what, name, err, schema)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}
	if err == nil {
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-1"}, func(context.Context, *sql.Tx) error { return nil })
		t.Errorf("with the name accepted, order-1, already claimed in %s.processed_x, was processed again: %v, %v", schema, out, err)
	}
	if n := count(t, db, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema); n != 1 {
		t.Errorf("%d tables in the schema, want 1: the one created by hand", n)
	}
}
