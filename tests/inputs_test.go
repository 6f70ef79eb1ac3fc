package tests

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// freshDB opens a pool that has not connected yet: if it still has no open
// connection after a call, the call sent nothing to the database.
func freshDB(t *testing.T) *sql.DB {
	t.Helper()
	db := openGuarded(t, "pq", 2)
	if n := db.Stats().OpenConnections; n != 0 {
		t.Fatalf("fresh pool has %d connections", n)
	}
	return db
}

func assertNothingSent(t *testing.T, db *sql.DB) {
	t.Helper()
	if n := db.Stats().OpenConnections; n != 0 {
		t.Errorf("%d connections opened: something was sent to the database", n)
	}
}

// randomUTF8 returns a valid UTF-8 string of exactly n bytes of random,
// hardly compressible characters.
func randomUTF8(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for b.Len() < n {
		max := int64(0x4e00 + 0x5000)
		if n-b.Len() < 3 {
			max = 0x7f - 0x21
		}
		r, err := rand.Int(rand.Reader, big.NewInt(max))
		if err != nil {
			t.Fatal(err)
		}
		if max < 0x100 {
			b.WriteRune(rune(0x21 + r.Int64()))
		} else {
			b.WriteRune(rune(0x4e00 + r.Int64()%0x5000)) // CJK: 3 bytes each
		}
	}
	return b.String()
}

func TestBadKeys(t *testing.T) {
	t.Parallel()
	setup := openGuarded(t, "pq", 2)
	l := newLoyalty(t, setup)
	table := l.schema + ".processed_messages"
	db := freshDB(t)
	var counts idempotent.Counts
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(table), idempotent.WithObserver(&counts))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, key, says string
	}{
		{"empty", "", "empty"},
		{"NUL", "order\x00-1", "NUL byte at 5"},
		{"NUL only", "\x00", "NUL"},
		{"invalid UTF-8", "order-\xff\xfe", "not valid UTF-8"},
		{"truncated UTF-8", "é"[:1], "not valid UTF-8"},
		{"over the limit", strings.Repeat("k", postgres.MaxKeyBytes+1), "1025 bytes, the limit is 1024"},
		{"over the limit in bytes, not runes", strings.Repeat("é", 513), "1026 bytes, the limit is 1024"},
		{"far over the limit", strings.Repeat("k", 1<<20), "the limit is 1024"},
	}
	ran := false
	fn := func(context.Context, *sql.Tx) error { ran = true; return nil }
	wrapped := idempotent.WrapMessage(mw, func(k string) (idempotent.Message, error) { return idempotent.Message{Key: k}, nil }, func(context.Context, *sql.Tx, string) error { ran = true; return nil })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: c.key}, fn)
			checkBadKey(t, "ProcessMessage", err, c.says)
			_, err = wrapped(context.Background(), c.key)
			checkBadKey(t, "WrapMessage", err, c.says)
			// Claim rejects the key before touching the (nil-safe) tx.
			_, err = mw.ClaimMessage(context.Background(), &sql.Tx{}, idempotent.Message{Key: c.key})
			checkBadKey(t, "ClaimMessage", err, c.says)
		})
	}
	if ran {
		t.Error("a handler ran for a bad key")
	}
	assertNothingSent(t, db)
	if n := count(t, setup, "SELECT count(*) FROM "+quoteTable(table)); n != 0 {
		t.Errorf("%d claims written for bad keys", n)
	}
	if counts.Failed() != int64(2*len(cases)) || counts.Applied() != 0 {
		t.Errorf("observer: %d failed, %d applied; want %d, 0", counts.Failed(), counts.Applied(), 2*len(cases))
	}
}

func checkBadKey(t *testing.T, call string, err error, says string) {
	t.Helper()
	if !errors.Is(err, idempotent.ErrInvalidKey) {
		t.Errorf("%s: %v, want ErrInvalidKey", call, err)
		return
	}
	if !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %q does not say %q", call, err, says)
	}
	if len(err.Error()) > 300 {
		t.Errorf("%s: error is %d bytes long; a huge key must not be echoed whole", call, len(err.Error()))
	}
}

// The longest keys the limit allows, with the longest consumer name, are
// claimed: the documented limit is what users meet, never the btree's.
func TestLongestKeyAndConsumer(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	l := newLoyalty(t, db)
	consumer := "c" + strings.Repeat("x", idempotent.MaxConsumerBytes-1)
	mw, err := idempotent.New(db, postgres.New(), consumer, idempotent.WithTable(l.schema+".processed_messages"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{strings.Repeat("k", postgres.MaxKeyBytes), randomUTF8(t, postgres.MaxKeyBytes), strings.Repeat("é", postgres.MaxKeyBytes/2)} {
		if len(key) != postgres.MaxKeyBytes {
			t.Fatalf("key of %d bytes", len(key))
		}
		for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
			if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, func(context.Context, *sql.Tx) error { return nil }); err != nil || got != want {
				t.Fatalf("key of %d bytes: (%v, %v), want %v", len(key), got, err, want)
			}
		}
		if n := claims(t, db, l.schema+".processed_messages", consumer, key); n != 1 {
			t.Errorf("%d claims for the stored key, want 1 (stored as given)", n)
		}
	}
}

func TestWrapKeyFunctionError(t *testing.T) {
	t.Parallel()
	db := freshDB(t)
	var counts idempotent.Counts
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithObserver(&counts))
	if err != nil {
		t.Fatal(err)
	}
	errNoID := errors.New("message has no order id")
	ran := false
	h := idempotent.WrapMessage(mw, func(o orderCompleted) (idempotent.Message, error) {
		if o.OrderID == 0 {
			return idempotent.Message{}, errNoID
		}
		return idempotent.Message{}, nil // a message function that returns an empty key
	}, func(context.Context, *sql.Tx, orderCompleted) error { ran = true; return nil })
	_, err = h(context.Background(), orderCompleted{})
	if !errors.Is(err, idempotent.ErrInvalidKey) || !errors.Is(err, errNoID) {
		t.Errorf("key function error: %v, want ErrInvalidKey wrapping the function's error", err)
	}
	_, err = h(context.Background(), orderCompleted{OrderID: 1})
	if !errors.Is(err, idempotent.ErrInvalidKey) || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty key from the key function: %v, want ErrInvalidKey saying empty", err)
	}
	if ran {
		t.Error("the handler ran")
	}
	if counts.Failed() != 2 {
		t.Errorf("observer counted %d failures, want 2", counts.Failed())
	}
	assertNothingSent(t, db)
}

func TestBadConsumerNames(t *testing.T) {
	t.Parallel()
	db := freshDB(t)
	cases := []struct{ name, says string }{
		{"", "empty"},
		{" loyalty", `' ' at byte 0`},
		{"-loyalty", `'-' at byte 0`},
		{"loyalty service", `' ' at byte 7`},
		{"loyalty\x00", `'\x00' at byte 7`},
		{"lóyalty", "at byte 1"},
		{"loyalty'; DROP TABLE balances; --", `'\'' at byte 7`},
		{`"loyalty"`, "at byte 0"},
		{strings.Repeat("c", idempotent.MaxConsumerBytes+1), "129 bytes, the limit is 128"},
	}
	for _, c := range cases {
		_, err := idempotent.New(db, postgres.New(), c.name)
		if err == nil {
			t.Errorf("New(%q) succeeded", c.name)
			continue
		}
		if !errors.Is(err, idempotent.ErrInvalidConsumer) {
			t.Errorf("New(%q): %v does not match ErrInvalidConsumer", c.name, err)
		}
		if !strings.Contains(err.Error(), "consumer name") || !strings.Contains(err.Error(), c.says) {
			t.Errorf("New(%q): %q does not name the problem (%s)", c.name, err, c.says)
		}
	}
	for _, ok := range []string{"loyalty", "a", "svc.loyalty-v2:orders/eu_1", strings.Repeat("c", idempotent.MaxConsumerBytes)} {
		if _, err := idempotent.New(db, postgres.New(), ok); err != nil {
			t.Errorf("New(%q): %v", ok, err)
		}
	}
	assertNothingSent(t, db)
}

func TestBadTableNames(t *testing.T) {
	t.Parallel()
	setup := openGuarded(t, "pq", 2)
	schema := tempSchema(t, setup)
	q := pq.QuoteIdentifier(schema)
	// A canary the injections would drop.
	if _, err := setup.Exec("CREATE TABLE " + q + ".y (id int)"); err != nil {
		t.Fatal(err)
	}
	db := freshDB(t)
	names := []string{
		"",
		"x; DROP TABLE y",
		schema + ".x; DROP TABLE " + schema + ".y",
		`"quoted"`,
		`x"; DROP TABLE y; --`,
		"a.b.c",
		"1abc",
		"a-b",
		"tbl name",
		"ümlaut",
		schema + ".",
		".t",
		"a..b",
		"t\x00",
		strings.Repeat("t", dialect.MaxIdentifierBytes+1),
		schema + "." + strings.Repeat("t", dialect.MaxIdentifierBytes+1),
		"processed_messages'",
		"x/*",
		// Upper-case letters: Postgres folds unquoted names, so a quoted
		// "Mixed_Case" would miss a table created by hand as Mixed_Case.
		schema + ".Mixed_Case",
		"Processed_X",
		"App." + "t",
	}
	for _, name := range names {
		mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(name))
		if !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("WithTable(%q): (%v, %v), want ErrInvalidIdentifier", name, mw, err)
			continue
		}
		if !strings.Contains(err.Error(), "table name") {
			t.Errorf("WithTable(%q): %q does not say it is the table name", name, err)
		}
	}
	assertNothingSent(t, db)
	if n := count(t, setup, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema); n != 1 {
		t.Errorf("%d tables in the schema, want only the canary", n)
	}
	if n := count(t, setup, "SELECT count(*) FROM "+q+".y"); n != 0 {
		t.Errorf("canary has %d rows", n)
	}
	// Names that are identifiers, including reserved words, work: the
	// dialect quotes them.
	for _, name := range []string{schema + ".select", schema + ".order", schema + "._t1"} {
		mw, err := idempotent.New(setup, postgres.New(), "loyalty", idempotent.WithTable(name))
		if err != nil {
			t.Fatalf("WithTable(%q): %v", name, err)
		}
		if err := mw.EnsureSchema(context.Background()); err != nil {
			t.Fatalf("EnsureSchema(%q): %v", name, err)
		}
		if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || got != idempotent.Applied {
			t.Fatalf("Process on %q: (%v, %v)", name, got, err)
		}
		if n := claims(t, setup, name, "loyalty", "k"); n != 1 {
			t.Errorf("%s: %d claims", name, n)
		}
	}
}

func TestBadOptionsAndArguments(t *testing.T) {
	t.Parallel()
	db := freshDB(t)
	d := postgres.New()
	cases := []struct {
		name string
		opts []idempotent.Option
		says string
	}{
		{"zero attempts", []idempotent.Option{idempotent.WithRetry(idempotent.RetryPolicy{})}, "MaxAttempts is 0"},
		{"negative backoff", []idempotent.Option{idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 2, InitialBackoff: -1})}, "InitialBackoff is negative"},
		{"max below initial", []idempotent.Option{idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, MaxBackoff: time.Millisecond})}, "less than InitialBackoff"},
		{"zero lock timeout", []idempotent.Option{idempotent.WithLockTimeout(0)}, "not a positive duration"},
		{"negative lock timeout", []idempotent.Option{idempotent.WithLockTimeout(-time.Second)}, "not a positive duration"},
		{"read-only", []idempotent.Option{idempotent.WithTxOptions(sql.TxOptions{ReadOnly: true})}, "read-only"},
		{"nil observer", []idempotent.Option{idempotent.WithObserver(nil)}, "nil observer"},
		{"nil option", []idempotent.Option{nil}, "nil option"},
	}
	for _, c := range cases {
		if _, err := idempotent.New(db, d, "loyalty", c.opts...); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.says)
		}
	}
	if _, err := idempotent.New(nil, d, "loyalty"); err == nil {
		t.Error("New with a nil *sql.DB succeeded")
	}
	if _, err := idempotent.New(db, nil, "loyalty"); err == nil {
		t.Error("New with a nil dialect succeeded")
	}
	mw, err := idempotent.New(db, d, "loyalty")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, nil); err == nil {
		t.Error("Process with a nil function succeeded")
	}
	if err := idempotent.RunTx(context.Background(), db, d, nil, idempotent.DefaultRetryPolicy(), nil); err == nil {
		t.Error("RunTx with a nil function succeeded")
	}
	assertNothingSent(t, db)
}

// A lock timeout beyond what Postgres accepts (about 24.8 days) must not
// make every message fail at run time.
func TestHugeLockTimeout(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	l := newLoyalty(t, db)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(l.schema+".processed_messages"), idempotent.WithLockTimeout(365*24*time.Hour))
	if err != nil {
		t.Logf("New refused it: %v", err)
		return
	}
	if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || got != idempotent.Applied {
		t.Fatalf("Process with a one-year lock timeout: (%v, %v)", got, err)
	}
}

// limitedDialect is the Postgres dialect without lock timeouts or
// transaction ids, as a database that has neither would be.
type limitedDialect struct{ *postgres.Dialect }

func (limitedDialect) Name() string                        { return "limited" }
func (limitedDialect) LockTimeoutSQL(time.Duration) string { return "" }
func (limitedDialect) TxIDSQL() string                     { return "" }

func TestOptionsTheDialectCannotHonour(t *testing.T) {
	t.Parallel()
	db := freshDB(t)
	d := limitedDialect{postgres.New()}
	if _, err := idempotent.New(db, d, "loyalty", idempotent.WithLockTimeout(time.Second)); err == nil || !strings.Contains(err.Error(), "limited dialect cannot bound lock waits") {
		t.Errorf("WithLockTimeout on a dialect without it: %v", err)
	}
	if _, err := idempotent.New(db, d, "loyalty", idempotent.WithStrictGuard()); err == nil || !strings.Contains(err.Error(), "limited dialect cannot identify transactions") {
		t.Errorf("WithStrictGuard on a dialect without it: %v", err)
	}
	mw, err := idempotent.New(db, d, "loyalty", idempotent.WithTable("app.claims"))
	if err != nil {
		t.Fatal(err)
	}
	if mw.Config().Consumer != "loyalty" || mw.Config().Table != "app.claims" || mw.Config().Dialect != d {
		t.Errorf("accessors: %q %q %v", mw.Config().Consumer, mw.Config().Table, mw.Config().Dialect)
	}
	assertNothingSent(t, db)
}

// EnsureSchema in a schema that does not exist fails clearly.
func TestEnsureSchemaMissingSchema(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 2)
	schema := uniqueName("missing")
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".claims"))
	if err != nil {
		t.Fatal(err)
	}
	err = mw.EnsureSchema(context.Background())
	if err == nil || !strings.Contains(err.Error(), "ensure schema of "+schema+".claims") || sqlState(err) != "3F000" {
		t.Errorf("EnsureSchema in a missing schema: %v, want an error naming the table with SQLSTATE 3F000", err)
	}
}
