package tests

import (
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// TestPostgresStatementsParseAsOne has the real server parse every
// statement the Postgres dialect builds, for table names that stress
// quoting (reserved words, mixed case, the longest identifier), through
// the extended protocol, which refuses more than one statement per Parse.
// Each statement then runs and must do exactly its job: the schema
// statements create the table and its two indexes and nothing else, and the
// claim inserts one row holding the key exactly as given (the key is a
// parameter, never SQL) and then none.
func TestPostgresStatementsParseAsOne(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	db.SetMaxOpenConns(2)
	schema := tempSchema(t, db)
	d := postgres.New()
	ctx := context.Background()
	names := []string{"processed_messages", "select", "order", "mixed_case", "user", strings.Repeat("m", 55), strings.Repeat("n", dialect.MaxIdentifierBytes)}
	keys := []string{"order-completed:9912", `'); DROP TABLE processed_messages; --`, `"; SELECT 1; --`, "$1", `\x00`, "日本語", strings.Repeat("k", postgres.MaxKeyBytes)}
	for _, n := range names {
		for _, qualified := range []bool{false, true} {
			name := n
			if qualified {
				name = schema + "." + n
			}
			t.Run(name, func(t *testing.T) {
				tb, err := dialect.ParseTable(name)
				if err != nil {
					t.Fatal(err)
				}
				conn, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				tx, err := conn.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback() }() // leave the schema empty for the next name
				if _, err := tx.ExecContext(ctx, "SET LOCAL search_path TO "+pq.QuoteIdentifier(schema)); err != nil {
					t.Fatal(err)
				}
				for i, s := range d.SchemaSQL(tb) {
					st, err := tx.PrepareContext(ctx, s)
					if err != nil {
						t.Fatalf("SchemaSQL[%d] does not parse as one statement: %v\n%s", i, err, s)
					}
					if _, err := st.ExecContext(ctx); err != nil {
						t.Fatalf("SchemaSQL[%d]: %v", i, err)
					}
					_ = st.Close()
				}
				var rels []string
				rows, err := tx.QueryContext(ctx, `SELECT c.relname || ':' || c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1`, schema)
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var r string
					if err := rows.Scan(&r); err != nil {
						t.Fatal(err)
					}
					rels = append(rels, r)
				}
				if err := rows.Close(); err != nil {
					t.Fatal(err)
				}
				// Every table gets its processed_at index and its horizon
				// table, whatever the length of its name (long names are
				// shortened with a hash).
				hz := postgres.HorizonName(tb.Name)
				want := []string{tb.Name + ":r", pkeyName(tb.Name) + ":i", postgres.IndexName(tb.Name) + ":i", hz + ":r", pkeyName(hz) + ":i"}
				sort.Strings(rels)
				sort.Strings(want)
				if strings.Join(rels, ",") != strings.Join(want, ",") {
					t.Fatalf("schema holds %q after SchemaSQL, want %q", rels, want)
				}

				claim, err := tx.PrepareContext(ctx, d.ClaimSQL(tb))
				if err != nil {
					t.Fatalf("ClaimSQL does not parse as one statement: %v\n%s", err, d.ClaimSQL(tb))
				}
				defer claim.Close()
				for _, k := range keys {
					for i, wantN := range []int64{1, 0} {
						res, err := claim.ExecContext(ctx, "loyalty", k)
						if err != nil {
							t.Fatalf("claim %q: %v", k, err)
						}
						if n, _ := res.RowsAffected(); n != wantN {
							t.Fatalf("claim %q, run %d: %d rows affected, want %d", k, i+1, n, wantN)
						}
					}
				}
				var n int
				var got []string
				rows, err = tx.QueryContext(ctx, "SELECT message_key FROM "+tb.Quoted(pq.QuoteIdentifier)+" ORDER BY message_key")
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var k string
					if err := rows.Scan(&k); err != nil {
						t.Fatal(err)
					}
					got = append(got, k)
					n++
				}
				if err := rows.Close(); err != nil {
					t.Fatal(err)
				}
				for _, k := range keys {
					found := false
					for _, g := range got {
						found = found || g == k
					}
					if !found {
						t.Fatalf("key %q not stored as given; table holds %q", k, got)
					}
				}
				if n != len(keys) {
					t.Fatalf("%d claims stored, want %d", n, len(keys))
				}
			})
		}
	}
}

// pkeyName is the name Postgres gives a table's primary key index: the
// table's name plus "_pkey", the table's part cut so the whole fits in 63
// bytes.
func pkeyName(table string) string {
	if len(table)+len("_pkey") > dialect.MaxIdentifierBytes {
		table = table[:dialect.MaxIdentifierBytes-len("_pkey")]
	}
	return table + "_pkey"
}
