package idemhttp

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// statements is the SQL text of the response table for one dialect. It is
// built once, in New, from validated table names; values are always
// parameters.
type statements struct {
	schema []string // CREATE TABLE / INDEX IF NOT EXISTS
	put    string   // upsert of one response: consumer, key, fingerprint, status, header, body, created_at
	get    string   // fingerprint, status, header, body of consumer, key
	// replay is get of a response whose claim exists: the one-statement
	// read of a completed request, before any claim (see
	// Middleware.completed).
	replay  string
	cleanup string // delete up to $2 responses created before $1 whose claim is gone
	stats   string // count of responses, oldest created_at (0 when none)

	// The upgrade of a table made by an earlier version, on MySQL and
	// MariaDB only (empty elsewhere): headerType reads the header column's
	// type from the catalog (schema or NULL for the connection's database,
	// table), and, when it is not a LONGBLOB, lockWait bounds the wait of
	// widenHeader's ALTER TABLE for the table's metadata lock.
	headerType  string
	lockWait    string
	widenHeader string
}

// HeaderLockWait is how long EnsureSchema's ALTER TABLE, on MySQL and
// MariaDB, waits for the response table's metadata lock when it widens the
// header column of a table made by an earlier version. Every transaction
// that stored a response holds that lock until it ends, and every statement
// on the table sent while the ALTER TABLE waits queues behind it, so the
// wait is kept short; past it EnsureSchema fails, having changed nothing,
// and can run again.
const HeaderLockWait = 5 * time.Second

// schemaStatements returns the DDL of dialect name that creates the
// response table resp and its created_at index if they do not exist, and
// the statement that drops the table (and so its index). It is the one
// source of the table's definition: EnsureSchema runs create, SchemaSQL
// returns both.
func schemaStatements(name string, resp dialect.Table) (create []string, drop string, err error) {
	switch name {
	case "postgres":
		r := resp.Quoted(doubleQuote)
		return []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer    text    NOT NULL,
	message_key text    NOT NULL,
	fingerprint bytea   NOT NULL,
	status      integer NOT NULL,
	header      bytea   NOT NULL,
	body        bytea   NOT NULL,
	created_at  bigint  NOT NULL,
	PRIMARY KEY (consumer, message_key)
)`, r),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (created_at)", doubleQuote(resp.Name+"_created"), r),
		}, "DROP TABLE IF EXISTS " + r, nil
	case "mysql":
		r := resp.Quoted(backQuote)
		return []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer    VARBINARY(128)  NOT NULL,
	message_key VARBINARY(1024) NOT NULL,
	fingerprint VARBINARY(64)   NOT NULL,
	status      INT             NOT NULL,
	header      LONGBLOB        NOT NULL,
	body        LONGBLOB        NOT NULL,
	created_at  BIGINT          NOT NULL,
	PRIMARY KEY (consumer, message_key),
	KEY %s (created_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`, r, backQuote(resp.Name+"_created")),
		}, "DROP TABLE IF EXISTS " + r, nil
	case "sqlite":
		r := resp.Quoted(doubleQuote)
		idx := doubleQuote(resp.Name + "_created")
		if resp.Schema != "" {
			idx = doubleQuote(resp.Schema) + "." + idx
		}
		return []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer    TEXT    NOT NULL,
	message_key TEXT    NOT NULL,
	fingerprint BLOB    NOT NULL,
	status      INTEGER NOT NULL,
	header      BLOB    NOT NULL,
	body        BLOB    NOT NULL,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (consumer, message_key)
)`, r),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (created_at)", idx, doubleQuote(resp.Name)),
		}, "DROP TABLE IF EXISTS " + r, nil
	}
	return nil, "", fmt.Errorf("%w: %q", ErrUnsupportedDialect, name)
}

// newStatements returns the statements of dialect name for the response
// table resp beside the claim table claims.
func newStatements(name string, resp, claims dialect.Table) (statements, error) {
	schema, _, err := schemaStatements(name, resp)
	if err != nil {
		return statements{}, err
	}
	switch name {
	case "postgres":
		r, c := resp.Quoted(doubleQuote), claims.Quoted(doubleQuote)
		return statements{
			schema: schema,
			put: fmt.Sprintf(`INSERT INTO %s (consumer, message_key, fingerprint, status, header, body, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer, message_key) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status,
header = excluded.header, body = excluded.body, created_at = excluded.created_at`, r),
			get:    fmt.Sprintf("SELECT fingerprint, status, header, body FROM %s WHERE consumer = $1 AND message_key = $2", r),
			replay: replaySQL(r, c, "$1", "$2"),
			// The outer created_at test is evaluated again on a row that a
			// concurrent first request re-wrote (Postgres rechecks the
			// target row after waiting for its lock), so a fresh response
			// that replaced an orphan is never deleted.
			cleanup: fmt.Sprintf(`DELETE FROM %[1]s WHERE (consumer, message_key) IN (
	SELECT x.consumer, x.message_key FROM %[1]s x WHERE x.created_at < $1
	AND NOT EXISTS (SELECT 1 FROM %[2]s c WHERE c.consumer = x.consumer AND c.message_key = x.message_key) LIMIT $2
) AND created_at < $1`, r, c),
			stats: statsSQL(r),
		}, nil
	case "mysql":
		r, c := resp.Quoted(backQuote), claims.Quoted(backQuote)
		return statements{
			schema: schema,
			put: fmt.Sprintf(`INSERT INTO %s (consumer, message_key, fingerprint, status, header, body, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), status = VALUES(status),
header = VALUES(header), body = VALUES(body), created_at = VALUES(created_at)`, r),
			get:    fmt.Sprintf("SELECT fingerprint, status, header, body FROM %s WHERE consumer = ? AND message_key = ?", r),
			replay: replaySQL(r, c, "?", "?"),
			cleanup: fmt.Sprintf(`DELETE FROM %[1]s WHERE created_at < ?
AND NOT EXISTS (SELECT 1 FROM %[2]s c WHERE c.consumer = %[1]s.consumer AND c.message_key = %[1]s.message_key) LIMIT ?`, r, c),
			stats:       statsSQL(r),
			headerType:  "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = 'header'",
			lockWait:    fmt.Sprintf("SET SESSION lock_wait_timeout = %d", int64(HeaderLockWait/time.Second)),
			widenHeader: fmt.Sprintf("ALTER TABLE %s MODIFY header LONGBLOB NOT NULL", r),
		}, nil
	case "sqlite":
		r, c := resp.Quoted(doubleQuote), claims.Quoted(doubleQuote)
		return statements{
			schema: schema,
			put: fmt.Sprintf(`INSERT INTO %s (consumer, message_key, fingerprint, status, header, body, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (consumer, message_key) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status,
header = excluded.header, body = excluded.body, created_at = excluded.created_at`, r),
			get:    fmt.Sprintf("SELECT fingerprint, status, header, body FROM %s WHERE consumer = ? AND message_key = ?", r),
			replay: replaySQL(r, c, "?", "?"),
			cleanup: fmt.Sprintf(`DELETE FROM %[1]s WHERE rowid IN (
	SELECT x.rowid FROM %[1]s x WHERE x.created_at < ?
	AND NOT EXISTS (SELECT 1 FROM %[2]s c WHERE c.consumer = x.consumer AND c.message_key = x.message_key) LIMIT ?
)`, r, c),
			stats: statsSQL(r),
		}, nil
	}
	return statements{}, fmt.Errorf("%w: %q", ErrUnsupportedDialect, name)
}

// SchemaSQL returns the DDL of d's dialect that creates (up) and drops
// (down) the response table named table ("table" or "schema.table"), with
// its created_at index, for a migration tool: the statements EnsureSchema
// runs, each ended by a semicolon, after a comment saying what the table
// is. table is the response table's name as [Middleware.Table] returns it:
// the claim table's followed by "_http" (processed_messages_http), unless
// [WithResponseTable] names another. The claim table has its own migration
// (package github.com/txclaim/idempotent/migrations, or the dialect's
// SchemaSQL).
//
// d is the dialect of the idempotent.Middleware given to [New] (or
// postgres for pgxhttp): postgres, mysql (MySQL and MariaDB) or sqlite;
// another is an error matching [ErrUnsupportedDialect].
//
// On MySQL and MariaDB, earlier versions of this package made the header
// column a BLOB, which holds at most 65,535 bytes of stored header fields;
// in the table of up it is a LONGBLOB, which, like the columns of the other
// dialects, holds whatever the server accepts in one statement.
// EnsureSchema widens an earlier table; where a migration tool made it, add
// a migration whose up is
//
//	ALTER TABLE processed_messages_http MODIFY header LONGBLOB NOT NULL;
//
// (with the response table's name), which copies the table once.
func SchemaSQL(d dialect.Dialect, table string) (up, down string, err error) {
	if d == nil {
		return "", "", errors.New("idemhttp: SchemaSQL needs a dialect")
	}
	t, err := dialect.ParseTable(table)
	if err != nil {
		return "", "", fmt.Errorf("idemhttp: response table: %w", err)
	}
	create, drop, err := schemaStatements(d.Name(), t)
	if err != nil {
		return "", "", err
	}
	var b strings.Builder
	b.WriteString("-- Response table of github.com/txclaim/idempotent/idemhttp: the stored response\n")
	b.WriteString("-- of each claimed request, keyed like its claim, replayed to the request's retries.\n")
	for _, q := range create {
		b.WriteString(q + ";\n")
	}
	return b.String(), drop + ";\n", nil
}

// doubleQuote quotes an identifier already validated by dialect.ParseTable
// (lower-case letters, digits and _), for Postgres and SQLite.
func doubleQuote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// backQuote quotes a validated identifier for MySQL and MariaDB.
func backQuote(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// stored is a response as kept in the response table.
type stored struct {
	fingerprint []byte
	status      int
	header      []byte // JSON of the stored header fields
	body        []byte
}

// get reads the stored response of key, outside any transaction, after
// the claim of key was found. found is false when there is none.
func (m *Middleware) get(ctx context.Context, key string) (s stored, found bool, err error) {
	return m.read(ctx, m.sql.get, key)
}

// completed reads the stored response of key if key's claim exists, in one
// statement outside any transaction, before the request claims: a request
// whose first run committed is answered with it in one round trip, and any
// other (no claim, a claim in flight, a response left behind by a claim
// cleaned up) finds nothing and goes on to the claim. docs/http.md
// ("Replays in one round trip") has the argument.
func (m *Middleware) completed(ctx context.Context, key string) (s stored, found bool, err error) {
	return m.read(ctx, m.sql.replay, key)
}

// read runs q, the get or replay statement, for key: on the Backend's own
// pool when it is a RowReader, on the Core's database/sql pool otherwise.
func (m *Middleware) read(ctx context.Context, q, key string) (s stored, found bool, err error) {
	dest := []any{&s.fingerprint, &s.status, &s.header, &s.body}
	if rr, ok := m.b.(RowReader); ok {
		found, err = rr.ReadRow(ctx, q, []any{m.claim.Consumer, key}, dest...)
	} else {
		err = m.db.QueryRowContext(ctx, q, m.claim.Consumer, key).Scan(dest...)
		found = err == nil
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
	}
	if err != nil {
		return stored{}, false, fmt.Errorf("idemhttp: read the stored response: %w", err)
	}
	if !found {
		return stored{}, false, nil
	}
	return s, true, nil
}

// put writes the response of key in the claim's transaction, replacing the
// row an earlier claim of the same key left behind after its claim was
// cleaned up.
func (m *Middleware) put(ctx context.Context, exec Exec, key string, s stored) error {
	if err := exec(ctx, m.sql.put, m.claim.Consumer, key, s.fingerprint, s.status, s.header, s.body, m.claim.Clock().UnixMicro()); err != nil {
		return fmt.Errorf("idemhttp: store the response: %w", err)
	}
	return nil
}

// EnsureSchema creates the response table and its created_at index if they
// do not exist. It does not create the claim table: call the
// idempotent.Middleware's EnsureSchema (or run its migration) too. Run it
// once at start, or take its statements into a migration; it is not meant
// to race another EnsureSchema of the same table.
//
// On MySQL and MariaDB it also upgrades a response table made by an
// earlier version of this package, whose header column is a BLOB: at most
// 65,535 bytes of stored header fields, past which a strict session
// refuses the response and a non-strict one cuts it short after the
// request has committed. It reads the column's type from the catalog and,
// only when it is not a LONGBLOB, runs ALTER TABLE … MODIFY header
// LONGBLOB NOT NULL, waiting at most [HeaderLockWait] for the table's
// metadata lock. The server copies the table to change the column's type,
// and responses wait to be stored while it does: on a large table, run the
// ALTER TABLE at a quiet time (see [SchemaSQL]).
func (m *Middleware) EnsureSchema(ctx context.Context) error {
	for _, q := range m.sql.schema {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("idemhttp: create the response table %s: %w", m.table, err)
		}
	}
	return m.widenHeader(ctx)
}

// widenHeader makes the header column of a MySQL or MariaDB response table
// made by an earlier version a LONGBLOB; it sends no DDL when the column is
// one already, and does nothing on the other dialects.
func (m *Middleware) widenHeader(ctx context.Context) error {
	if m.sql.headerType == "" {
		return nil
	}
	var schema any
	if m.resp.Schema != "" {
		schema = m.resp.Schema
	}
	var typ string
	if err := m.db.QueryRowContext(ctx, m.sql.headerType, schema, m.resp.Name).Scan(&typ); err != nil {
		return fmt.Errorf("idemhttp: read the type of the header column of %s: %w", m.table, err)
	}
	if strings.EqualFold(typ, "longblob") {
		return nil
	}
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemhttp: widen the header column of %s: %w", m.table, err)
	}
	defer conn.Close()
	// The session keeps the bounded lock wait: the connection is closed
	// rather than given back to the pool.
	defer func() { _ = conn.Raw(func(any) error { return driver.ErrBadConn }) }()
	if _, err := conn.ExecContext(ctx, m.sql.lockWait); err != nil {
		return fmt.Errorf("idemhttp: widen the header column of %s: %w", m.table, err)
	}
	if _, err := conn.ExecContext(ctx, m.sql.widenHeader); err != nil {
		return fmt.Errorf("idemhttp: widen the header column of %s from %s to LONGBLOB (%s; it waits at most %v for the table's metadata lock, and on failure changed nothing: run EnsureSchema again): %w", m.table, typ, m.sql.widenHeader, HeaderLockWait, err)
	}
	return nil
}

// DefaultCleanupBatch is the number of responses one statement of Cleanup
// deletes at most.
const DefaultCleanupBatch = 1000

// replaySQL is the replay statement of the quoted response table r beside
// the quoted claim table c, with consumer and key the placeholders of the
// consumer and the claim key: the stored response of the key, only if the
// key's claim exists. One statement reads both tables in one snapshot, so
// the row it returns is the response its committed claim committed with.
func replaySQL(r, c, consumer, key string) string {
	return fmt.Sprintf(`SELECT r.fingerprint, r.status, r.header, r.body FROM %s r
JOIN %s c ON c.consumer = r.consumer AND c.message_key = r.message_key
WHERE r.consumer = %s AND r.message_key = %s`, r, c, consumer, key)
}

// statsSQL is the stats statement of the quoted response table r, the
// same on every dialect.
func statsSQL(r string) string {
	return fmt.Sprintf("SELECT count(*), COALESCE(min(created_at), 0) FROM %s", r)
}

// Cleanup deletes the stored responses whose claim is gone, in statements of
// at most batch rows (DefaultCleanupBatch when batch <= 0), each its own
// short transaction, until one deletes nothing. Run it after the claim
// table's cleanup (idempotent.ClaimTable.Cleanup), from the same scheduled
// job.
//
// Such a response can no longer be replayed: a response is read only after
// its claim is found, and a new claim of the same key overwrites it. Cleanup
// only gives the space back. Responses younger than the claim table's
// retention window are never deleted, so a first request that is re-writing
// one of them at the same moment keeps its fresh response.
func (m *Middleware) Cleanup(ctx context.Context, batch int) (deleted int64, err error) {
	return cleanup(ctx, m.db, m.sql.cleanup, m.table, m.claim.Clock().Add(-m.claim.Retention), batch)
}

// cleanup runs stmt, a cleanup statement of table, with cutoff and batch
// until it deletes nothing.
func cleanup(ctx context.Context, db *sql.DB, stmt, table string, cutoff time.Time, batch int) (deleted int64, err error) {
	if batch <= 0 {
		batch = DefaultCleanupBatch
	}
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		res, err := db.ExecContext(ctx, stmt, cutoff.UnixMicro(), batch)
		if err != nil {
			return deleted, fmt.Errorf("idemhttp: clean up %s: %w", table, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return deleted, fmt.Errorf("idemhttp: clean up %s: %w", table, err)
		}
		deleted += n
		if n == 0 {
			return deleted, nil
		}
	}
}

// Tables names a response table and the claim table beside it, for the
// table-wide upkeep a tool runs without a Middleware (the idempotent
// command): CleanupTable and TableStats.
type Tables struct {
	// Claims is the claim table, "table" or "schema.table".
	Claims string
	// Responses is the response table; "" is the default beside Claims
	// (its name followed by "_http", as New names it).
	Responses string
}

// parse returns the statements of d for t, and the response table's name.
func (t Tables) parse(d dialect.Dialect) (statements, string, error) {
	if d == nil {
		return statements{}, "", errors.New("idemhttp: nil dialect")
	}
	claims, err := dialect.ParseTable(t.Claims)
	if err != nil {
		return statements{}, "", fmt.Errorf("idemhttp: claim table: %w", err)
	}
	name := t.Responses
	if name == "" {
		name = claims.Name + "_http"
		if claims.Schema != "" {
			name = claims.Schema + "." + name
		}
	}
	resp, err := dialect.ParseTable(name)
	if err != nil {
		return statements{}, "", fmt.Errorf("idemhttp: response table: %w", err)
	}
	st, err := newStatements(d.Name(), resp, claims)
	return st, resp.String(), err
}

// CleanupTable is Middleware.Cleanup for a tool that has the tables and the
// claims' retention window but no Middleware: it deletes, in batches, the
// responses of t stored more than retention ago (by the database server's
// clock as the local one reads it: now) whose claim is gone. Give the
// claim table's retention window, the one its cleanup used.
func CleanupTable(ctx context.Context, db *sql.DB, d dialect.Dialect, t Tables, retention time.Duration, batch int) (int64, error) {
	if retention <= 0 {
		return 0, fmt.Errorf("idemhttp: CleanupTable: retention %v is not a positive duration", retention)
	}
	st, name, err := t.parse(d)
	if err != nil {
		return 0, err
	}
	return cleanup(ctx, db, st.cleanup, name, time.Now().Add(-retention), batch)
}

// ResponseStats are the figures of a response table.
type ResponseStats struct {
	// Responses is how many responses are stored.
	Responses int64
	// Oldest is when the oldest was stored (zero when none is).
	Oldest time.Time
}

// TableStats counts the responses of t (a full scan).
func TableStats(ctx context.Context, db *sql.DB, d dialect.Dialect, t Tables) (ResponseStats, error) {
	st, name, err := t.parse(d)
	if err != nil {
		return ResponseStats{}, err
	}
	var s ResponseStats
	var oldest int64
	if err := db.QueryRowContext(ctx, st.stats).Scan(&s.Responses, &oldest); err != nil {
		return ResponseStats{}, fmt.Errorf("idemhttp: stats of %s: %w", name, err)
	}
	if oldest != 0 {
		s.Oldest = time.UnixMicro(oldest).UTC()
	}
	return s, nil
}
