package seenredis_test

import (
	"context"
	"database/sql"
	"net/url"
	"slices"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// TestDefaultsTwoDatabasesOneRedis is issue 20's case 3 for a shared
// Redis: staging and production — two databases on one server, each with
// the claim table "<schema>.claims" — run the consumer "orders", each with
// a seenredis.Seen of its own on one Redis, with the default prefix. A
// message applied in one is applied in the other too: the pre-check never
// answers for the other database, and each table gets its claim.
func TestDefaultsTwoDatabasesOneRedis(t *testing.T) {
	r := startRedis(t)
	prod := openDB(t)
	staging := createDatabase(t, prod)
	schema := testenv.UniqueName("t")
	ctx := context.Background()
	var mws []*idempotent.Middleware
	for _, db := range []*sql.DB{prod, staging} {
		mustExec(t, db, "CREATE SCHEMA "+schema)
		t.Cleanup(func() { mustExec(t, db, "DROP SCHEMA "+schema+" CASCADE") })
		mustExec(t, db, "CREATE TABLE "+schema+".effects (id text PRIMARY KEY, n int NOT NULL)")
		s, _ := newSeen(t, r.addr) // defaults: DefaultPrefix, one Seen per process
		m, err := idempotent.New(db, postgres.New(), "orders", idempotent.WithTable(schema+".claims"), idempotent.WithSeen(s))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		mws = append(mws, m)
	}
	effect := func(keys ...string) func(ctx context.Context, tx *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			for _, k := range keys {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".effects (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1", k); err != nil {
					return err
				}
			}
			return nil
		}
	}
	batch := []string{"order-2", "order-3"}
	for round, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		for i, m := range mws {
			if out, err := m.ProcessMessage(ctx, idempotent.Message{Key: "order-1"}, effect("order-1")); err != nil || out != want {
				t.Errorf("round %d, database %d: ProcessMessage = %v, %v; want %v", round+1, i, out, err, want)
			}
			outs, err := m.ProcessMessages(ctx, keyMessages(batch...), func(ctx context.Context, tx *sql.Tx, fresh []int) error {
				var keys []string
				for _, j := range fresh {
					keys = append(keys, batch[j])
				}
				return effect(keys...)(ctx, tx)
			})
			if err != nil || !slices.Equal(outs, []idempotent.Outcome{want, want}) {
				t.Errorf("round %d, database %d: ProcessMessages = %v, %v; want two %v", round+1, i, outs, err, want)
			}
		}
	}
	for i, db := range []*sql.DB{prod, staging} {
		var claims int
		if err := db.QueryRow("SELECT count(*) FROM " + schema + ".claims").Scan(&claims); err != nil {
			t.Fatal(err)
		}
		if claims != 3 {
			t.Errorf("database %d: %d claims, want 3", i, claims)
		}
		auditEffects(t, db, schema, 3)
	}
	// The two scopes' keys are apart under the one default prefix.
	s, c := newSeen(t, r.addr)
	for _, m := range mws {
		scope, err := m.SeenScope(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.Exists(ctx, s.Key(scope, "order-1"), s.Key(scope, "order-2"), s.Key(scope, "order-3")).Result()
		if err != nil || n != 3 {
			t.Errorf("scope %v: %d of its keys in Redis (%v), want 3", scope, n, err)
		}
	}
}

// createDatabase creates a database of the test's own on db's server,
// dropped in Cleanup, and returns a pool on it.
func createDatabase(t *testing.T, db *sql.DB) *sql.DB {
	t.Helper()
	name := testenv.UniqueName("seenredis")
	mustExec(t, db, "CREATE DATABASE "+name)
	t.Cleanup(func() { mustExec(t, db, "DROP DATABASE "+name+" WITH (FORCE)") })
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	other, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	other.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = other.Close() })
	return other
}
