package idempotent

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/txclaim/idempotent/dialect"
)

// fuzzMaxKey is fuzzDialect's key limit, the Postgres dialect's.
const fuzzMaxKey = 1024

// fuzzDialect is a dialect that only the validation paths touch: its SQL
// is never run, since the connector refuses every connection.
type fuzzDialect struct{}

func (fuzzDialect) Name() string                        { return "fuzz" }
func (fuzzDialect) MaxKeyBytes() int                    { return fuzzMaxKey }
func (fuzzDialect) SchemaSQL(dialect.Table) []string    { return nil }
func (fuzzDialect) ClaimSQL(dialect.Table) string       { return "claim" }
func (fuzzDialect) LockTimeoutSQL(time.Duration) string { return "" }
func (fuzzDialect) TxIDSQL() string                     { return "" }
func (fuzzDialect) Classify(error) dialect.Class        { return dialect.Class{} }

// fuzzConnector is a driver.Connector that counts connection attempts
// and refuses them all: a Process that reaches the database shows up in
// its count.
type fuzzConnector struct{ dials atomic.Int64 }

var errFuzzRefused = errors.New("test connector: no database here")

func (c *fuzzConnector) Connect(context.Context) (driver.Conn, error) {
	c.dials.Add(1)
	return nil, errFuzzRefused
}

func (c *fuzzConnector) Driver() driver.Driver { return fuzzDriver{} }

type fuzzDriver struct{}

func (fuzzDriver) Open(string) (driver.Conn, error) { return nil, errFuzzRefused }

// fuzzKeyRule is the documented rule for message keys, written out
// independently of validateKey.
func fuzzKeyRule(k string, max int) bool {
	return k != "" && len(k) <= max && utf8.ValidString(k) && !strings.ContainsRune(k, 0)
}

// FuzzProcessKey checks every key against the documented rule: a key
// validateKey accepts is exactly one the rule accepts, and a rejected key
// gets an error that matches ErrInvalidKey, says more than the sentinel,
// and never reaches the database through Process.
func FuzzProcessKey(f *testing.F) {
	for _, k := range []string{
		"order-completed:9912", "", "\x00", "a\x00b", "\xff", "\xed\xa0\x80", "日本語",
		strings.Repeat("k", fuzzMaxKey), strings.Repeat("k", fuzzMaxKey+1),
		strings.Repeat("é", fuzzMaxKey/2), "'); DROP TABLE processed_messages; --",
	} {
		f.Add(k)
	}
	conn := &fuzzConnector{}
	db := sql.OpenDB(conn)
	f.Cleanup(func() { _ = db.Close() })
	mw, err := New(db, fuzzDialect{}, "loyalty")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := fuzzKeyRule(key, fuzzMaxKey)
		err := validateKey(key, fuzzMaxKey)
		if (err == nil) != want {
			t.Fatalf("validateKey(%q) = %v, the documented rule says valid=%v", key, err, want)
		}
		if want {
			return
		}
		fuzzCheckRejection(t, err, ErrInvalidKey)
		before := conn.dials.Load()
		ran := false
		outcome, err := mw.ProcessMessage(context.Background(), Message{Key: key}, func(context.Context, *sql.Tx) error { ran = true; return nil })
		if outcome != 0 || ran {
			t.Fatalf("Process(%q): outcome %v, handler ran %v; want neither", key, outcome, ran)
		}
		fuzzCheckRejection(t, err, ErrInvalidKey)
		if n := conn.dials.Load() - before; n != 0 {
			t.Fatalf("Process(%q) with an invalid key opened %d connections", key, n)
		}
		if _, err := mw.ClaimMessage(context.Background(), &sql.Tx{}, Message{Key: key}); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("Claim(%q) = %v, want ErrInvalidKey", key, err)
		}
	})
}

// fuzzConsumerRule is the documented rule for consumer names.
var fuzzConsumerRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]*$`)

// FuzzNewConsumer checks consumer names against the documented rule: New
// accepts exactly the names the rule accepts, and rejects the others with
// an error that says what is wrong with the consumer name, before any
// connection is made.
func FuzzNewConsumer(f *testing.F) {
	for _, c := range []string{
		"loyalty", "", "-x", ".x", "a.b_c-d:e/f", "a b", "a;b", "a'b", `a"b`, "é", "a\x00",
		strings.Repeat("c", MaxConsumerBytes), strings.Repeat("c", MaxConsumerBytes+1),
	} {
		f.Add(c)
	}
	conn := &fuzzConnector{}
	db := sql.OpenDB(conn)
	f.Cleanup(func() { _ = db.Close() })
	f.Fuzz(func(t *testing.T, consumer string) {
		want := len(consumer) <= MaxConsumerBytes && fuzzConsumerRule.MatchString(consumer)
		mw, err := New(db, fuzzDialect{}, consumer)
		if (err == nil) != want {
			t.Fatalf("New(consumer %q) = %v, the documented rule says valid=%v", consumer, err, want)
		}
		if conn.dials.Load() != 0 {
			t.Fatal("New opened a connection")
		}
		if want {
			if mw.Config().Consumer != consumer {
				t.Fatalf("Consumer() = %q, want %q", mw.Config().Consumer, consumer)
			}
			return
		}
		if !errors.Is(err, ErrInvalidConsumer) {
			t.Fatalf("New(%q): %v does not match ErrInvalidConsumer", consumer, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "consumer name") || len(msg) < len("idempotent: consumer name is empty") {
			t.Fatalf("New(consumer %q): error %q does not say what is wrong with the consumer name", consumer, msg)
		}
		if errors.Is(err, ErrInvalidKey) || errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Fatalf("New(consumer %q): error %v matches a sentinel of another input", consumer, err)
		}
	})
}

// FuzzNewTable checks WithTable against dialect.ParseTable: New accepts a
// table name exactly when ParseTable does, keeps it as given, and rejects
// the others with an error matching dialect.ErrInvalidIdentifier that
// names the table.
func FuzzNewTable(f *testing.F) {
	for _, s := range []string{
		"processed_messages", "app.processed_messages", "", ".", "a.", ".a", "a.b.c", "1a", "_a1",
		`a"b`, "a;b", "a b", "select", "ÄÖ", strings.Repeat("t", dialect.MaxIdentifierBytes),
		strings.Repeat("t", dialect.MaxIdentifierBytes+1), `x"; DROP TABLE y; --`,
	} {
		f.Add(s)
	}
	conn := &fuzzConnector{}
	db := sql.OpenDB(conn)
	f.Cleanup(func() { _ = db.Close() })
	f.Fuzz(func(t *testing.T, name string) {
		_, perr := dialect.ParseTable(name)
		mw, err := New(db, fuzzDialect{}, "loyalty", WithTable(name))
		if (err == nil) != (perr == nil) {
			t.Fatalf("New(WithTable(%q)) = %v but ParseTable says %v", name, err, perr)
		}
		if err == nil {
			if mw.Config().Table != name {
				t.Fatalf("Table() = %q, want %q", mw.Config().Table, name)
			}
			return
		}
		fuzzCheckRejection(t, err, dialect.ErrInvalidIdentifier)
		if !strings.Contains(err.Error(), "table name") {
			t.Fatalf("New(WithTable(%q)): error %q does not say it is about the table name", name, err)
		}
	})
}

// fuzzCheckRejection fails unless err matches sentinel and says more than the
// sentinel alone.
func fuzzCheckRejection(t *testing.T, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %v does not match %v", err, sentinel)
	}
	if msg := err.Error(); len(msg) <= len(sentinel.Error()) {
		t.Fatalf("error %q does not name the problem beyond %q", msg, sentinel)
	}
}
