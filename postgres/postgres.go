package postgres

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
)

// MaxKeyBytes is the longest message key the Postgres dialect accepts. A
// btree index entry is limited to about 2,700 bytes; 1,024 bytes of key plus
// a consumer name stays well inside it, so the limit users meet is this
// documented one and never the index's.
const MaxKeyBytes = 1024

// Dialect is the Postgres dialect. It works with any database/sql driver for
// Postgres whose errors expose their SQLSTATE through a SQLState() string
// method (lib/pq's *pq.Error and pgx's *pgconn.PgError both do).
type Dialect struct {
	dialect.OrderSQL[orderSyntax]
}

var _ dialect.Dialect = (*Dialect)(nil)

// New returns the Postgres dialect.
func New() *Dialect { return &Dialect{} }

// Name returns "postgres".
func (*Dialect) Name() string { return "postgres" }

// MaxKeyBytes returns [MaxKeyBytes].
func (*Dialect) MaxKeyBytes() int { return MaxKeyBytes }

func quote(t dialect.Table) string { return t.Quoted(pq.QuoteIdentifier) }

// SchemaSQL returns the guide's Step 1 table and its processed_at index:
// SchemaLockSQL, then the CreateSQL of each of SchemaObjects. The statements
// start by taking a transaction-scoped advisory lock derived from the table
// name, so that processes creating the table at the same moment do not
// collide on Postgres's catalog. EnsureSchema runs only what the catalog
// says is missing (see dialect.SchemaInspector).
func (d *Dialect) SchemaSQL(t dialect.Table) []string {
	return d.lockedSchemaSQL(t, false)
}

func (d *Dialect) lockedSchemaSQL(t dialect.Table, partitioned bool) []string {
	objs := d.SchemaObjects(t, partitioned)
	out := make([]string, 0, 1+len(objs))
	out = append(out, d.SchemaLockSQL(t))
	for _, o := range objs {
		out = append(out, o.CreateSQL)
	}
	return out
}

var _ dialect.SchemaInspector = (*Dialect)(nil)

// SchemaObjects returns the claim table, unless partitioned its
// processed_at index (named by [IndexName]) — a partitioned table has no
// index: see PartitionedSchemaSQL — and its horizon table (HorizonTable).
func (d *Dialect) SchemaObjects(t dialect.Table, partitioned bool) []dialect.SchemaObject {
	horizon := dialect.SchemaObject{Kind: dialect.ObjectTable, Table: d.HorizonTable(t), CreateSQL: d.HorizonSchemaSQL(t)[0]}
	if partitioned {
		return []dialect.SchemaObject{{Kind: dialect.ObjectTable, Table: t, CreateSQL: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer     text        NOT NULL,
	message_key  text        NOT NULL,
	event_day    date        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_key, event_day)
) PARTITION BY RANGE (event_day)`, quote(t))}, horizon}
	}
	index := IndexName(t.Name)
	return []dialect.SchemaObject{
		{Kind: dialect.ObjectTable, Table: t, CreateSQL: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer     text        NOT NULL,
	message_key  text        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_key)
)`, quote(t))},
		{Kind: dialect.ObjectIndex, Table: t, Name: index, CreateSQL: fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)",
			pq.QuoteIdentifier(index), quote(t))},
		horizon,
	}
}

// ObjectExistsSQL finds a table with to_regclass, which resolves a name as
// the claim statements do (through search_path when unqualified), and an
// index by its name among the table's indexes in pg_index. Neither locks
// the table: CREATE INDEX IF NOT EXISTS would take a SHARE lock on it
// before looking for the index, waiting behind every open claim while
// every new claim waits behind it.
func (*Dialect) ObjectExistsSQL(o dialect.SchemaObject) (string, []any) {
	if o.Kind == dialect.ObjectIndex {
		return `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1) AND c.relname = $2)`, []any{quote(o.Table), o.Name}
	}
	return "SELECT to_regclass($1) IS NOT NULL", []any{quote(o.Table)}
}

// SchemaLockSQL returns pg_advisory_xact_lock on a key derived from the
// table name, the same in both modes.
func (*Dialect) SchemaLockSQL(t dialect.Table) string {
	h := fnv.New64a()
	_, _ = io.WriteString(h, "idempotent:schema:"+t.String())
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", int64(h.Sum64()))
}

// DDLLockTimeoutSQL returns LockTimeoutSQL's SET LOCAL lock_timeout, which
// ends with the transaction.
func (d *Dialect) DDLLockTimeoutSQL(timeout time.Duration) (string, bool) {
	return d.LockTimeoutSQL(timeout), false
}

// IsDDLLockTimeout reports SQLSTATE 55P03 lock_not_available.
func (*Dialect) IsDDLLockTimeout(err error) bool { return sqlState(err) == "55P03" }

// IndexName returns the name of the processed_at index of the claim table
// name (unqualified, unquoted):
// name + "_processed_at" when that fits in Postgres's 63-byte identifiers.
// A longer one would be truncated by the server — possibly to the table's own
// name, or to the index name of another long table sharing the prefix — and
// CREATE INDEX IF NOT EXISTS would then silently skip the index. So long names
// keep a prefix and add a hash of the whole name instead.
func IndexName(name string) string { return suffixed(name, "_processed_at") }

// suffixed returns name + suffix when that fits in an identifier, else a
// prefix of name, a hash of the whole name and suffix.
func suffixed(name, suffix string) string {
	if len(name)+len(suffix) <= dialect.MaxIdentifierBytes {
		return name + suffix
	}
	h := fnv.New32a()
	_, _ = io.WriteString(h, name)
	tag := fmt.Sprintf("_%08x", h.Sum32())
	return name[:dialect.MaxIdentifierBytes-len(suffix)-len(tag)] + tag + suffix
}

// ClaimSQL returns INSERT … ON CONFLICT DO NOTHING: one row affected when the
// claim is new, none when it exists. A concurrent claim of the same key waits
// for the holder's transaction and then sees the conflict (or inserts, if the
// holder rolled back).
func (*Dialect) ClaimSQL(t dialect.Table) string {
	return fmt.Sprintf("INSERT INTO %s (consumer, message_key) VALUES ($1, $2) ON CONFLICT DO NOTHING", quote(t))
}

// LockTimeoutSQL returns SET LOCAL lock_timeout, which lasts until the end of
// the transaction. A wait longer than d fails with SQLSTATE 55P03. Durations
// are rounded up to whole milliseconds, and capped at Postgres's largest
// lock_timeout, 2147483647ms (about 24.8 days): the server rejects anything
// longer, which would fail every message. d <= 0 returns "".
func (*Dialect) LockTimeoutSQL(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	ms := min((d+time.Millisecond-1)/time.Millisecond, math.MaxInt32)
	return fmt.Sprintf("SET LOCAL lock_timeout = %d", int64(ms))
}

// TxIDSQL returns a query for the current transaction's id. After the claim
// has inserted, the transaction has an id; an explicit COMMIT, or a pooler
// that moved the session, makes the next read return another one.
func (*Dialect) TxIDSQL() string { return "SELECT txid_current()::text" }

// Classify maps SQLSTATEs and transport errors to dialect kinds:
//
//	40001 serialization_failure, 40P01 deadlock_detected  KindSerialization
//	class 08 (connection exceptions), 57P01 admin_shutdown,
//	57P02 crash_shutdown, 57P03 cannot_connect_now,
//	25006 read_only_sql_transaction (a standby),
//	0A000 with a standby's refusal of BEGIN (see below),
//	a driver refusing every host of target_session_attrs,
//	driver.ErrBadConn, EOF, network errors, errors with a
//	SafeToRetry() bool method (pgx's connection failures) KindConnection
//	55P03 lock_not_available                              KindLockTimeout
//	42P01 undefined_table                                 KindUndefinedTable
//
// During a failover clients see all of these: connection refused (a
// network error) and 57P01/57P02 while the old primary goes down, 57P03
// while the new one finishes recovery, and 25006 when a connection made
// through a virtual IP, DNS name, proxy or multi-host string reached a
// server that is still (or again) a standby. The claim is the first write
// of every transaction, so a standby answers it with 25006 before any
// effect: the transaction is retried like a lost connection, reaching the
// primary once the switch is done. A 25006 that lasts (a pool pinned to
// a standby) fails after the RetryPolicy's attempts.
//
// lib/pq begins every transaction READ WRITE, and a standby refuses that
// BEGIN with 0A000 feature_not_supported, "cannot set transaction
// read-write mode during recovery" (and a SERIALIZABLE BEGIN with 0A000,
// "cannot use serializable mode in a hot standby"). 0A000 also names
// features a server lacks for good, so only those two messages are
// KindConnection; a server whose lc_messages translates them leaves them
// KindOther, the handler's failure.
//
// A multi-host connection string with target_session_attrs=read-write
// whose hosts are all standbys at the moment (between the old primary's
// death and the promotion) fails to connect with the drivers' own errors,
// which carry no SQLSTATE: lib/pq's "server is in hot standby mode" and
// "session is read-only", pgx's pgconn.ErrReadOnlyConnection ("read only
// connection") and ErrStandbyConnection ("server is in standby mode").
// Those messages, as the whole text of an error in the chain, are
// KindConnection.
//
// 40003 statement_completion_unknown is deliberately KindOther: the server
// itself does not know what happened to the statement.
func (*Dialect) Classify(err error) dialect.Class {
	if err == nil {
		return dialect.Class{}
	}
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		code := se.SQLState()
		switch {
		case code == "40001" || code == "40P01":
			return dialect.Class{Kind: dialect.KindSerialization, Code: code}
		case len(code) == 5 && code[:2] == "08", code == "57P01", code == "57P02", code == "57P03", code == "25006":
			return dialect.Class{Kind: dialect.KindConnection, Code: code}
		case code == "55P03":
			return dialect.Class{Kind: dialect.KindLockTimeout, Code: code}
		case code == "42P01":
			return dialect.Class{Kind: dialect.KindUndefinedTable, Code: code}
		case code == "0A000" && standbyBegin(se):
			return dialect.Class{Kind: dialect.KindConnection, Code: code}
		}
		return dialect.Class{Kind: dialect.KindOther, Code: code}
	}
	if connectionLost(err) || noWritableHost(err) {
		return dialect.Class{Kind: dialect.KindConnection}
	}
	return dialect.Class{Kind: dialect.KindOther}
}

// standbyBeginRefusals are the messages of a hot standby refusing a BEGIN
// with 0A000: lib/pq's BEGIN READ WRITE, and any driver's BEGIN ISOLATION
// LEVEL SERIALIZABLE.
var standbyBeginRefusals = []string{
	"cannot set transaction read-write mode during recovery",
	"cannot use serializable mode in a hot standby",
}

// standbyBegin reports whether a 0A000 error is a standby's refusal of a
// read-write or serializable BEGIN.
func standbyBegin(se interface{ SQLState() string }) bool {
	e, ok := se.(error)
	if !ok {
		return false
	}
	msg := e.Error()
	for _, m := range standbyBeginRefusals {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// targetSessionRefusals are the errors with which the drivers refuse a
// host that target_session_attrs does not accept, when it wants a
// writable primary: lib/pq (v1.12) and pgx's pgconn (ErrReadOnlyConnection,
// ErrStandbyConnection). They are matched as the whole message of one
// error in the chain, as the drivers make them with errors.New.
var targetSessionRefusals = map[string]bool{
	"server is in hot standby mode": true, // lib/pq
	"session is read-only":          true, // lib/pq
	"read only connection":          true, // pgx
	"server is in standby mode":     true, // pgx
}

// noWritableHost reports whether err, or an error it wraps or joins, is a
// driver's refusal of a host that is not a writable primary.
func noWritableHost(err error) bool {
	if err == nil {
		return false
	}
	if targetSessionRefusals[err.Error()] {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return noWritableHost(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if noWritableHost(e) {
				return true
			}
		}
	}
	return false
}

func connectionLost(err error) bool {
	// pgx's pgconn marks every client-side failure of the connection —
	// a failed write or read, a connection already closed by an earlier
	// failure in the same operation, such as a COMMIT whose answer was
	// lost — with a SafeToRetry method, whatever it answers. Its server
	// errors carry an SQLSTATE instead and were classified above. Without
	// this, pgx's "conn closed" after a lost COMMIT, which wraps no network
	// error, was not retried.
	var pgconnErr interface{ SafeToRetry() bool }
	if errors.As(err, &pgconnErr) {
		return true
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne *net.OpError
	return errors.As(err, &ne)
}
