package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/txclaim/idempotent/dialect"
)

// MaxKeyBytes is the longest message key the SQLite dialect accepts. SQLite
// itself has no index-entry limit that a key could meet; 1,024 bytes is the
// same limit as the other dialects, so a key valid on one is valid on all.
const MaxKeyBytes = 1024

// MinVersion is the oldest SQLite the dialect runs on: INSERT … ON CONFLICT
// DO NOTHING arrived in 3.24.0.
const MinVersion = "3.24.0"

// Dialect is the SQLite dialect. Its zero value is ready to use.
type Dialect struct {
	dialect.OrderSQL[orderSyntax]
}

var (
	_ dialect.Dialect       = (*Dialect)(nil)
	_ dialect.ServerChecker = (*Dialect)(nil)
)

// New returns the SQLite dialect.
func New() *Dialect { return &Dialect{} }

// Name returns "sqlite".
func (*Dialect) Name() string { return "sqlite" }

// MaxKeyBytes returns [MaxKeyBytes].
func (*Dialect) MaxKeyBytes() int { return MaxKeyBytes }

// quoteIdent quotes an identifier with double quotes. Identifiers reaching
// a dialect are already plain (see dialect.ParseTable); quoting keeps
// reserved words working.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func quote(t dialect.Table) string { return t.Quoted(quoteIdent) }

// SchemaSQL returns the claim table, keyed by (consumer, message_key) and
// stored WITHOUT ROWID (the primary key is the table), and its processed_at
// index: the CreateSQL of SchemaObjects, in order. processed_at is UTC text
// such as "2024-05-01 12:00:00.123", the format of SQLite's own datetime
// functions, so it compares correctly with datetime('now', '-7 days'). A
// schema-qualified table names an attached database.
func (d *Dialect) SchemaSQL(t dialect.Table) []string {
	objs := d.SchemaObjects(t, false)
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i] = o.CreateSQL
	}
	return out
}

var _ dialect.SchemaInspector = (*Dialect)(nil)

// SchemaObjects returns the claim table and its processed_at index. The
// dialect has no partitioned mode; partitioned is ignored.
func (*Dialect) SchemaObjects(t dialect.Table, _ bool) []dialect.SchemaObject {
	name := t.Name + "_processed_at"
	index := quoteIdent(name)
	if t.Schema != "" {
		index = quoteIdent(t.Schema) + "." + index
	}
	return []dialect.SchemaObject{
		{Kind: dialect.ObjectTable, Table: t, CreateSQL: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer     TEXT NOT NULL,
	message_key  TEXT NOT NULL,
	processed_at TEXT NOT NULL DEFAULT (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')),
	PRIMARY KEY (consumer, message_key)
) WITHOUT ROWID`, quote(t))},
		{Kind: dialect.ObjectIndex, Table: t, Name: name, CreateSQL: fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)", index, quoteIdent(t.Name))},
	}
}

// ObjectExistsSQL looks the object up in the sqlite_master of the table's
// database (main unless the table names an attached one), ignoring ASCII
// case as SQLite's own name lookup does. Reading it takes no write lock, so
// it does not wait for a writer holding one.
func (*Dialect) ObjectExistsSQL(o dialect.SchemaObject) (string, []any) {
	master := "sqlite_master"
	if o.Table.Schema != "" {
		master = quoteIdent(o.Table.Schema) + ".sqlite_master"
	}
	if o.Kind == dialect.ObjectIndex {
		return "SELECT EXISTS (SELECT 1 FROM " + master + " WHERE type = 'index' AND name = ? COLLATE NOCASE)", []any{o.Name}
	}
	return "SELECT EXISTS (SELECT 1 FROM " + master + " WHERE type = 'table' AND name = ? COLLATE NOCASE)", []any{o.Table.Name}
}

// SchemaLockSQL returns "": SQLite runs one writing transaction at a time.
func (*Dialect) SchemaLockSQL(dialect.Table) string { return "" }

// DDLLockTimeoutSQL returns "": the transaction that creates what is
// missing waits for the write lock at BEGIN, for the connection's
// busy_timeout ([BusyTimeout] with [Open]), and a waiting writer holds
// nothing that other writers queue behind.
func (*Dialect) DDLLockTimeoutSQL(time.Duration) (string, bool) { return "", false }

// IsDDLLockTimeout reports SQLITE_BUSY and its extended codes: the write
// lock was not free within the busy timeout.
func (*Dialect) IsDDLLockTimeout(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// ClaimSQL returns INSERT … ON CONFLICT DO NOTHING: one row changed when the
// claim is new, none when it exists. Keys compare byte for byte (SQLite's
// BINARY collation), so "A" and "a" are different keys.
func (*Dialect) ClaimSQL(t dialect.Table) string {
	return fmt.Sprintf("INSERT INTO %s (consumer, message_key) VALUES (?, ?) ON CONFLICT DO NOTHING", quote(t))
}

// LockTimeoutSQL returns "": SQLite cannot bound one transaction's wait. A
// writer waits at BEGIN for the busy_timeout of its connection, a setting
// that outlives the transaction. idempotent.New therefore refuses
// WithLockTimeout; set the wait with the DSN's busy_timeout instead.
func (*Dialect) LockTimeoutSQL(time.Duration) string { return "" }

// TxIDSQL returns "": SQLite has no transaction id, so the strict guard is
// not available and idempotent.New refuses WithStrictGuard.
func (*Dialect) TxIDSQL() string { return "" }

// Classify finds a *sqlite.Error (modernc.org/sqlite) with errors.As and
// maps its primary result code:
//
//	SQLITE_BUSY (5) and its extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT,
//	BUSY_TIMEOUT), SQLITE_LOCKED (6) and its extended codes
//	(LOCKED_SHAREDCACHE, LOCKED_VTAB)                     KindSerialization
//	driver.ErrBadConn                                     KindConnection
//
// Code is the full (extended) result code in decimal, such as "517" for
// SQLITE_BUSY_SNAPSHOT. Everything else, including "no such table" (a plain
// SQLITE_ERROR), is KindOther.
func (*Dialect) Classify(err error) dialect.Class {
	if err == nil {
		return dialect.Class{}
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		code := se.Code()
		c := dialect.Class{Kind: dialect.KindOther, Code: strconv.Itoa(code)}
		switch code & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			c.Kind = dialect.KindSerialization
		}
		return c
	}
	if errors.Is(err, driver.ErrBadConn) {
		return dialect.Class{Kind: dialect.KindConnection}
	}
	return dialect.Class{Kind: dialect.KindOther}
}

// versionSQL is the query CheckServer runs.
const versionSQL = "SELECT sqlite_version()"

// CheckServer asks for sqlite_version(), a function only SQLite has, and
// requires [MinVersion] or later. On another database the query fails, and
// the error wraps dialect.ErrWrongDatabase.
func (d *Dialect) CheckServer(ctx context.Context, _ dialect.Table, q dialect.QueryFunc) error {
	v, err := q(ctx, versionSQL)
	if err != nil {
		if d.Classify(err).Retryable() {
			return err
		}
		return fmt.Errorf("sqlite dialect: %w: %s failed, so the database is not SQLite (is the *sql.DB opened with another driver?): %w", dialect.ErrWrongDatabase, versionSQL, err)
	}
	if !versionAtLeast(v, MinVersion) {
		return fmt.Errorf("sqlite dialect: SQLite %s is too old: the claim needs %s or later", v, MinVersion)
	}
	return nil
}

// versionAtLeast compares dotted version numbers such as "3.45.1".
func versionAtLeast(v, min string) bool {
	a, b := strings.Split(v, "."), strings.Split(min, ".")
	for i := range b {
		if i >= len(a) {
			return false
		}
		x, err1 := strconv.Atoi(a[i])
		y, err2 := strconv.Atoi(b[i])
		if err1 != nil || err2 != nil {
			return false
		}
		if x != y {
			return x > y
		}
	}
	return true
}
