package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// TestIdentitySQLGolden: the one query Identity sends, and its argument,
// for every table of the golden tests.
func TestIdentitySQLGolden(t *testing.T) {
	d := postgres.New()
	var b strings.Builder
	for _, tb := range tables {
		fmt.Fprintf(&b, "-- table %q.%q\n", tb.Schema, tb.Name)
		id, err := d.Identity(context.Background(), tb, func(_ context.Context, q string, args ...any) (string, error) {
			fmt.Fprintf(&b, "%s;\n-- args %q\n", q, args)
			return "name", nil
		})
		if err != nil || id != "name" {
			t.Fatalf("Identity = %q, %v", id, err)
		}
		b.WriteString("\n")
	}
	golden.Compare(t, filepath.Join("testdata", "identity_sql.golden"), b.String())

	boom := errors.New("boom")
	if _, err := d.Identity(context.Background(), tables[0], func(context.Context, string, ...any) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Errorf("a failed query: %v, want it wrapped", err)
	}
	if _, err := d.Identity(context.Background(), tables[0], func(context.Context, string, ...any) (string, error) { return "", nil }); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("NULL (no table): %v, want an error saying the table does not exist", err)
	}
}

// identity reads the name of table on db.
func identity(t *testing.T, db *sql.DB, table string) (string, error) {
	t.Helper()
	tb, err := dialect.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	return postgres.New().Identity(context.Background(), tb, func(ctx context.Context, q string, args ...any) (string, error) {
		var s sql.NullString
		err := db.QueryRowContext(ctx, q, args...).Scan(&s)
		return s.String, err
	})
}

// openDSN opens a pool on database (the test database when "") of the
// test server, with params added to its DSN, closed in Cleanup.
func openDSN(t *testing.T, database string, params url.Values) *sql.DB {
	t.Helper()
	u, err := url.Parse(testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err != nil {
		t.Fatal(err)
	}
	if database != "" {
		u.Path = "/" + database
	}
	q := u.Query()
	for k, v := range params {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// schema creates a schema of the test's own, dropped in Cleanup.
func schema(t *testing.T, db *sql.DB) string {
	t.Helper()
	s := testenv.UniqueName("identity")
	mustExec(t, db, "CREATE SCHEMA "+s)
	t.Cleanup(func() { mustExec(t, db, "DROP SCHEMA "+s+" CASCADE") })
	return s
}

// TestIdentityOnTheServer reads the name on the real server: the same from
// two pools and in any time zone, with the server's start time; different
// for another table, for the table truncated, for the same name found by
// another search_path, for a table dropped and re-created, and for another
// database; an error for a table that does not exist.
func TestIdentityOnTheServer(t *testing.T) {
	db := testenv.OpenPostgres(t, 4)
	s := schema(t, db)
	mustExec(t, db, "CREATE TABLE "+s+".claims (k text)")
	mustExec(t, db, "CREATE TABLE "+s+".other (k text)")
	name, err := identity(t, db, s+".claims")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("identity: %s", name)
	if !strings.HasPrefix(name, "postgres system ") || !strings.Contains(name, " timeline ") || !strings.HasSuffix(name, " "+currentDatabase(t, db)) {
		t.Fatalf("identity %q: want the system identifier, the timeline and the database", name)
	}
	if again, err := identity(t, openDSN(t, "", nil), s+".claims"); err != nil || again != name {
		t.Fatalf("another pool: %q, %v; want %q", again, err, name)
	}
	if other, err := identity(t, db, s+".other"); err != nil || other == name {
		t.Fatalf("another table: %q, %v; want a name other than %q", other, err, name)
	}

	// The server's start, to the microsecond, in a text no session
	// setting changes.
	var start string
	if err := db.QueryRow("SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text").Scan(&start); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(name, " start "+start+" table ") {
		t.Fatalf("identity %q: want the server's start %s µs", name, start)
	}
	if tz, err := identity(t, openDSN(t, "", url.Values{"timezone": {"Asia/Kathmandu"}}), s+".claims"); err != nil || tz != name {
		t.Fatalf("a session in another time zone: %q, %v; want %q", tz, err, name)
	}

	// TRUNCATE gives the table new storage: a new name, whose start is
	// the same.
	mustExec(t, db, "TRUNCATE "+s+".claims")
	truncated, err := identity(t, db, s+".claims")
	if err != nil || truncated == name || !strings.Contains(truncated, " start "+start+" ") {
		t.Fatalf("truncated: %q, %v; want a name other than %q, with the same start", truncated, err, name)
	}
	name = truncated

	// A partitioned table has no storage of its own.
	mustExec(t, db, "CREATE TABLE "+s+".parts (d date) PARTITION BY RANGE (d)")
	if p, err := identity(t, db, s+".parts"); err != nil || !strings.Contains(p, " storage 0 database ") {
		t.Fatalf("a partitioned table: %q, %v; want storage 0", p, err)
	}

	// Tenants: the same unqualified name, found in another schema by the
	// session's search_path.
	s2 := schema(t, db)
	mustExec(t, db, "CREATE TABLE "+s2+".claims (k text)")
	a, errA := identity(t, openDSN(t, "", url.Values{"search_path": {s}}), "claims")
	b, errB := identity(t, openDSN(t, "", url.Values{"search_path": {s2}}), "claims")
	if errA != nil || errB != nil || a != name || a == b {
		t.Fatalf("claims by search_path: %q (%v) and %q (%v); want %q and another", a, errA, b, errB, name)
	}

	// Dropped and re-created, as a dump restored in place would.
	mustExec(t, db, "DROP TABLE "+s+".claims")
	if _, err := identity(t, db, s+".claims"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a missing table: %v, want an error saying it does not exist", err)
	}
	mustExec(t, db, "CREATE TABLE "+s+".claims (k text)")
	if again, err := identity(t, db, s+".claims"); err != nil || again == name {
		t.Fatalf("re-created: %q, %v; want a name other than %q", again, err, name)
	}

	// Another database on the same server, with a table of the same name.
	other := testenv.UniqueName("identity")
	mustExec(t, db, "CREATE DATABASE "+other)
	t.Cleanup(func() { mustExec(t, db, "DROP DATABASE "+other+" WITH (FORCE)") })
	odb := openDSN(t, other, nil)
	mustExec(t, odb, "CREATE SCHEMA "+s)
	mustExec(t, odb, "CREATE TABLE "+s+".claims (k text)")
	o, err := identity(t, odb, s+".claims")
	if err != nil || o == name || !strings.HasSuffix(o, " "+other) {
		t.Fatalf("another database: %q, %v; want a name of its own ending in %s", o, err, other)
	}
	if sys := strings.Fields(name)[2]; strings.Fields(o)[2] != sys {
		t.Fatalf("another database of the same cluster: %q, want the system identifier %s", o, sys)
	}
}

func currentDatabase(t *testing.T, db *sql.DB) string {
	t.Helper()
	var s string
	if err := db.QueryRow("SELECT current_database()").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSeenTenantsBySearchPath is issue 20's case 3 for tenants: two
// Middlewares of one consumer, both on the table "claims" of one database,
// each found in the tenant's schema by its pool's search_path, sharing one
// SeenLRU. Each tenant's message applies in its own table; the pre-check
// never answers for the other tenant.
func TestSeenTenantsBySearchPath(t *testing.T) {
	db := testenv.OpenPostgres(t, 4)
	lru, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var tenants []string
	var mws []*idempotent.Middleware
	for i := 0; i < 2; i++ {
		s := schema(t, db)
		mustExec(t, db, "CREATE TABLE "+s+".effects (k text PRIMARY KEY)")
		tdb := openDSN(t, "", url.Values{"search_path": {s}})
		m, err := idempotent.New(tdb, postgres.New(), "orders", idempotent.WithTable("claims"), idempotent.WithSeen(lru))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		tenants, mws = append(tenants, s), append(mws, m)
	}
	for i, m := range mws {
		out, err := m.ProcessMessage(ctx, idempotent.Message{Key: "order-1"}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO effects (k) VALUES ('order-1')")
			return err
		})
		if err != nil || out != idempotent.Applied {
			t.Errorf("tenant %d (%s): %v, %v; want applied", i, tenants[i], out, err)
		}
	}
	for _, s := range tenants {
		var claims, effects int
		if err := db.QueryRow("SELECT (SELECT count(*) FROM "+s+".claims), (SELECT count(*) FROM "+s+".effects)").Scan(&claims, &effects); err != nil {
			t.Fatal(err)
		}
		if claims != 1 || effects != 1 {
			t.Errorf("tenant %s: %d claims, %d effects; want 1 and 1", s, claims, effects)
		}
	}
}
