package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
)

// MaxKeyBytes is the longest message key the MySQL dialect accepts. The
// primary key (consumer VARBINARY(128), message_key VARBINARY(1024)) stays
// well inside InnoDB's 3,072-byte index limit, and VARBINARY counts bytes,
// so a key of up to 1,024 bytes of UTF-8 always fits.
const MaxKeyBytes = 1024

// MySQL and MariaDB error numbers the dialect classifies.
const (
	errLockWaitTimeout   = 1205 // ER_LOCK_WAIT_TIMEOUT
	errLockDeadlock      = 1213 // ER_LOCK_DEADLOCK, SQLSTATE 40001
	errCheckRead         = 1020 // ER_CHECKREAD: MariaDB's write conflict under innodb_snapshot_isolation
	errNoSuchTable       = 1146 // ER_NO_SUCH_TABLE
	errServerShutdown    = 1053 // ER_SERVER_SHUTDOWN
	errConnectionKilled  = 1927 // ER_CONNECTION_KILLED (MariaDB)
	errClientInteraction = 4031 // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+)
	errServerGone        = 2006 // CR_SERVER_GONE_ERROR
	errServerLost        = 2013 // CR_SERVER_LOST
	// errWsrepNotReady is ER_UNKNOWN_COM_ERROR, SQLSTATE 08S01, as a
	// Galera node answers it ("WSREP has not yet prepared node for
	// application use") while it is outside the primary component, still
	// joining, or rejecting queries (wsrep_reject_queries = ALL).
	errWsrepNotReady = 1047
	// errErrorDuringCommit is ER_ERROR_DURING_COMMIT, "Got error N ...
	// during COMMIT": on a Galera node N is the provider's status when
	// replicating the write set failed (see wsrepRetryable); elsewhere a
	// storage engine's error.
	errErrorDuringCommit = 1180
)

// wsrepRetryable holds the Galera provider statuses (wsrep::provider::status)
// with which a COMMIT fails as error 1180 and rolls the transaction back, so
// that running it again may commit: 2 transaction missing, 3 certification
// failed, 4 aborted by a replicated transaction (brute-force abort), 6
// connection failed (the node lost the primary component while
// replicating). The others — 5 write set larger than wsrep_max_ws_size, 7
// and 8 provider failures, 9 not implemented, 10 not allowed — fail again
// on a retry.
var wsrepRetryable = map[int]bool{2: true, 3: true, 4: true, 6: true}

// commitStatus returns N of a 1180 message "Got error N ... during
// COMMIT", or -1.
func commitStatus(msg string) int {
	rest, ok := strings.CutPrefix(msg, "Got error ")
	if !ok {
		return -1
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end <= 0 {
		return -1
	}
	n, err := strconv.Atoi(rest[:end])
	if err != nil {
		return -1
	}
	return n
}

// Dialect is the MySQL/MariaDB dialect. Its zero value is ready to use.
type Dialect struct {
	dialect.OrderSQL[orderSyntax]
}

var (
	_ dialect.Dialect             = (*Dialect)(nil)
	_ dialect.ServerChecker       = (*Dialect)(nil)
	_ dialect.LockTimeoutResetter = (*Dialect)(nil)
)

// New returns the MySQL/MariaDB dialect.
func New() *Dialect { return &Dialect{} }

// Name returns "mysql".
func (*Dialect) Name() string { return "mysql" }

// MaxKeyBytes returns [MaxKeyBytes].
func (*Dialect) MaxKeyBytes() int { return MaxKeyBytes }

// quoteIdent quotes an identifier with backticks. Identifiers reaching a
// dialect are already plain (see dialect.ParseTable); quoting keeps
// reserved words working.
func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

func quote(t dialect.Table) string { return t.Quoted(quoteIdent) }

// SchemaSQL returns the claim table, an InnoDB table keyed by (consumer,
// message_key) with an index on processed_at: the CreateSQL of the first of
// SchemaObjects, which creates the index with the table. A schema-qualified
// table names a database.
//
// The key columns are VARBINARY: they compare byte for byte, so "A" and
// "a", or "x" and "x " (which a PAD SPACE collation such as utf8mb4_bin
// would equate), are different keys, as on Postgres. processed_at is a
// DATETIME(6) in UTC, whatever the session's time zone; DATETIME, unlike
// TIMESTAMP, has no 2038 limit. claim_flip exists only to make the claim
// statement report a duplicate the same way whatever the driver's
// clientFoundRows setting (see ClaimSQL); its value means nothing.
func (d *Dialect) SchemaSQL(t dialect.Table) []string {
	return []string{d.SchemaObjects(t, false)[0].CreateSQL}
}

var _ dialect.SchemaInspector = (*Dialect)(nil)

func indexName(t dialect.Table) string { return t.Name + "_processed_at" }

// SchemaObjects returns the claim table, whose CREATE TABLE IF NOT EXISTS
// includes the processed_at index, and the index on its own, created with
// CREATE INDEX only when a table that already existed lacks it; when
// partitioned, the table of PartitionedSchemaSQL alone (it has no
// processed_at index: old claims leave by dropping days).
func (d *Dialect) SchemaObjects(t dialect.Table, partitioned bool) []dialect.SchemaObject {
	if partitioned {
		return []dialect.SchemaObject{{Kind: dialect.ObjectTable, Table: t, CreateSQL: d.PartitionedSchemaSQL(t)[0]}}
	}
	return []dialect.SchemaObject{
		{Kind: dialect.ObjectTable, Table: t, CreateSQL: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer     VARBINARY(128)  NOT NULL,
	message_key  VARBINARY(%d) NOT NULL,
	processed_at DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
	claim_flip   TINYINT         NOT NULL DEFAULT 0,
	PRIMARY KEY (consumer, message_key),
	KEY %s (processed_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`, quote(t), MaxKeyBytes, quoteIdent(indexName(t)))},
		{Kind: dialect.ObjectIndex, Table: t, Name: indexName(t), CreateSQL: fmt.Sprintf("CREATE INDEX %s ON %s (processed_at)",
			quoteIdent(indexName(t)), quote(t))},
	}
}

// ObjectExistsSQL asks information_schema.TABLES or STATISTICS, in the
// table's database or the connection's, comparing names the way the server
// resolves them. The claim table's metadata lock is not waited for.
func (*Dialect) ObjectExistsSQL(o dialect.SchemaObject) (string, []any) {
	var schema any
	if o.Table.Schema != "" {
		schema = o.Table.Schema
	}
	if o.Kind == dialect.ObjectIndex {
		return "SELECT COUNT(*) > 0 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND INDEX_NAME = ?",
			[]any{schema, o.Table.Name, o.Name}
	}
	return "SELECT COUNT(*) > 0 FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
		[]any{schema, o.Table.Name}
}

// SchemaLockSQL returns "": MySQL's DDL commits on its own, so no lock
// could span the check and the statement. Two processes adding the same
// missing index at once are harmless: the loser's CREATE INDEX fails, and
// EnsureSchema then finds the index and forgives it.
func (*Dialect) SchemaLockSQL(dialect.Table) string { return "" }

// DDLLockTimeoutSQL sets the session's lock_wait_timeout, which bounds the
// wait for a table's metadata lock, to d rounded up to whole seconds (at
// least 1s). DDL waits for that lock behind every open transaction that
// used the table, and every new claim waits behind the DDL. The setting is
// the session's, so the middleware closes the connection afterwards.
func (*Dialect) DDLLockTimeoutSQL(d time.Duration) (string, bool) {
	s := max((d+time.Second-1)/time.Second, 1)
	return fmt.Sprintf("SET SESSION lock_wait_timeout = %d", int64(s)), true
}

// IsDDLLockTimeout reports error 1205, which a metadata lock wait that ran
// out of lock_wait_timeout returns as a row lock wait does.
func (*Dialect) IsDDLLockTimeout(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errLockWaitTimeout
}

// ClaimSQL returns
//
//	INSERT INTO t (consumer, message_key) VALUES (?, ?)
//	ON DUPLICATE KEY UPDATE claim_flip = 1 - claim_flip
//
// which reports 1 affected row when it inserted and 2 when the claim
// existed. The update really changes the row, so the server reports 2 for
// a duplicate under both settings of the driver's clientFoundRows (with
// "consumer = consumer", a duplicate would report 0 rows without it but 1
// — "found" — with it, and be taken for a new claim). The middleware rolls
// a duplicate's transaction back, so the flip is never kept there.
//
// INSERT IGNORE is not used: it also turns truncation, bad values and
// other errors into warnings. A concurrent claim of the same key waits for
// the holder's row lock, then finds the claim, or inserts it if the holder
// rolled back.
func (*Dialect) ClaimSQL(t dialect.Table) string {
	return fmt.Sprintf("INSERT INTO %s (consumer, message_key) VALUES (?, ?) ON DUPLICATE KEY UPDATE claim_flip = 1 - claim_flip", quote(t))
}

// lockSaveVar holds the session's own innodb_lock_wait_timeout, saved the
// first time a claim on the connection sets a lock timeout.
const lockSaveVar = "@idempotent_lock_wait_timeout"

// LockTimeoutSQL sets the session's innodb_lock_wait_timeout to d, rounded
// up to whole seconds (InnoDB's unit; the least is 1s), after saving the
// session's own value in a user variable. The setting is per session, not
// per transaction, so the middleware restores it right after the claim with
// LockTimeoutResetSQL: on MySQL the timeout bounds the claim's wait only.
// The save keeps the first value it sees on a connection, so even a reset
// that could not run (a context cancelled between the two) is repaired by
// the next claim on that connection. (The casts keep the saved value an
// integer: a user variable never set is a NULL string, and the server
// refuses a string for this variable.) A wait longer than d fails with error
// 1205, which the middleware reports as ErrClaimBusy. d <= 0 returns "".
func (*Dialect) LockTimeoutSQL(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	s := (d + time.Second - 1) / time.Second
	return fmt.Sprintf("SET %[1]s = CAST(COALESCE(%[1]s, @@SESSION.innodb_lock_wait_timeout) AS UNSIGNED), SESSION innodb_lock_wait_timeout = %[2]d", lockSaveVar, int64(s))
}

// LockTimeoutResetSQL restores the session's own innodb_lock_wait_timeout.
func (*Dialect) LockTimeoutResetSQL() string {
	return "SET SESSION innodb_lock_wait_timeout = CAST(" + lockSaveVar + " AS UNSIGNED)"
}

// TxIDSQL returns a query for MariaDB's @@in_transaction, which is 1 inside
// the claim's transaction and 0 once the handler has committed it (or
// rolled it back) itself: the strict guard compares it before commit with
// its value after the claim. MySQL has no such variable, nor a transaction
// id a session can read reliably (information_schema.innodb_trx is a cache
// refreshed every 0.1s and needs the PROCESS privilege), so on MySQL the
// query fails with error 1193 and WithStrictGuard cannot be used. A handler
// that commits and begins a new transaction itself is not caught this way;
// the autocommit guard (idempotent.GuardConnector) still catches statements
// run outside the transaction.
func (*Dialect) TxIDSQL() string { return "SELECT @@in_transaction" }

// Classify finds a *mysql.MySQLError (github.com/go-sql-driver/mysql) with
// errors.As and maps its error number:
//
//	1213 deadlock (SQLSTATE 40001), 1020 record changed
//	(MariaDB's snapshot-isolation write conflict),
//	1180 "Got error N during COMMIT" with a Galera
//	provider status N that a retry may clear               KindSerialization
//	1205 lock wait timeout                                 KindLockTimeout
//	1146 no such table                                     KindUndefinedTable
//	1053 server shutdown, 1927 connection killed,
//	4031 client interaction timeout, 2006, 2013,
//	1047 Galera node not ready (non-primary, joining,
//	wsrep_reject_queries)                                  KindConnection
//
// On a Galera cluster (MariaDB Cluster, Percona XtraDB Cluster) a
// transaction that loses certification against a write set committed on
// another node fails with 1213 — at COMMIT, or at its next statement when
// the applier aborted it first — and is retried like any deadlock; the
// claim then finds the winner's row (Duplicate). A node that left the
// primary component answers 1047 to every statement until it rejoins: the
// retry waits out the rejoin, or a proxy's switch to another node, within
// the RetryPolicy. A COMMIT whose write set the provider could not
// replicate fails with 1180 and the provider's status: certification failed
// (3), aborted by a replicated transaction (4), the node lost the primary
// component while replicating (6), the transaction missing (2) are retried
// (the transaction was rolled back); a write set larger than
// wsrep_max_ws_size (5) and the provider's other statuses are not, nor is
// 1180 with a storage engine's error (a plain server's "Got error 28 ...",
// say, and any other number). A node killing its sessions (wsrep_reject_queries =
// ALL_KILL) gives 1927 or a lost connection, retried as well. A causal read
// that waits longer than its bound (wsrep_sync_wait) fails with 1205, a
// lock wait timeout.
//
// A lost connection, which the driver reports as mysql.ErrInvalidConn or
// driver.ErrBadConn (or the network error itself), is KindConnection. Code
// is the error number in decimal, such as "1213".
func (*Dialect) Classify(err error) dialect.Class {
	if err == nil {
		return dialect.Class{}
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		c := dialect.Class{Kind: dialect.KindOther, Code: strconv.Itoa(int(me.Number))}
		switch me.Number {
		case errLockDeadlock, errCheckRead:
			c.Kind = dialect.KindSerialization
		case errErrorDuringCommit:
			if wsrepRetryable[commitStatus(me.Message)] {
				c.Kind = dialect.KindSerialization
			}
		case errLockWaitTimeout:
			c.Kind = dialect.KindLockTimeout
		case errNoSuchTable:
			c.Kind = dialect.KindUndefinedTable
		case errServerShutdown, errConnectionKilled, errClientInteraction, errServerGone, errServerLost, errWsrepNotReady:
			c.Kind = dialect.KindConnection
		}
		return c
	}
	if connectionLost(err) {
		return dialect.Class{Kind: dialect.KindConnection}
	}
	return dialect.Class{Kind: dialect.KindOther}
}

func connectionLost(err error) bool {
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne *net.OpError
	return errors.As(err, &ne)
}

// The queries CheckServer runs, in order.
const (
	versionSQL     = "SELECT VERSION()"
	databaseSQL    = "SELECT DATABASE()"
	innodbSQL      = "SELECT SUPPORT FROM information_schema.ENGINES WHERE ENGINE = 'InnoDB'"
	tableEngineSQL = "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"
)

// CheckServer checks that the server is MySQL or MariaDB (VERSION() starts
// with a version number, where Postgres answers "PostgreSQL …" and SQLite
// has no such function), that a database is selected or the table names
// one, that InnoDB is available, and that an existing claim table is an
// InnoDB table: on MyISAM a rolled-back transaction would keep its claim
// and lose its effect. A wrong server gives an error wrapping
// dialect.ErrWrongDatabase.
func (d *Dialect) CheckServer(ctx context.Context, t dialect.Table, q dialect.QueryFunc) error {
	v, err := q(ctx, versionSQL)
	if err != nil {
		if d.Classify(err).Retryable() {
			return err
		}
		return fmt.Errorf("mysql dialect: %w: %s failed, so the server is not MySQL or MariaDB (is the *sql.DB opened with another driver?): %w", dialect.ErrWrongDatabase, versionSQL, err)
	}
	if v == "" || v[0] < '0' || v[0] > '9' {
		return fmt.Errorf("mysql dialect: %w: the server says it is %q, not MySQL or MariaDB (is the *sql.DB opened with another driver?)", dialect.ErrWrongDatabase, firstLine(v))
	}
	if t.Schema == "" {
		db, err := q(ctx, databaseSQL)
		if err != nil {
			return fmt.Errorf("mysql dialect: %s: %w", databaseSQL, err)
		}
		if db == "" {
			return fmt.Errorf("mysql dialect: no database selected: name one in the DSN (…/dbname) or qualify the table (WithTable(\"db.%s\"))", t.Name)
		}
	}
	support, err := q(ctx, innodbSQL)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("mysql dialect: check InnoDB: %w", err)
	}
	if support != "YES" && support != "DEFAULT" {
		return fmt.Errorf("mysql dialect: the InnoDB engine is not available on %s (support %q): claims need its transactions and row locks", v, support)
	}
	var schema any
	if t.Schema != "" {
		schema = t.Schema
	}
	engine, err := q(ctx, tableEngineSQL, schema, t.Name)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("mysql dialect: check the engine of %s: %w", t, err)
	}
	if engine != "" && !strings.EqualFold(engine, "InnoDB") {
		return fmt.Errorf("mysql dialect: the claim table %s uses the %s engine: it must be InnoDB (ALTER TABLE %s ENGINE=InnoDB)", t, engine, quote(t))
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
