package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/dialect/dialecttest"
	"github.com/txclaim/idempotent/mysql"
)

// Checks of the MySQL/MariaDB retention statements that the conformance
// suite cannot make of every dialect: the user locks (named after the
// table and its database, released on every path), MariaDB's statement
// timeout, and the partition DDL's bounded wait. TestConformanceMySQL runs
// them as extras.

// mysqlRetentionTable creates a claim table with its horizon table and
// returns it, with a connection of its own.
func mysqlRetentionTable(t *testing.T, e *dialecttest.Env) (*sql.DB, string, dialect.Table) {
	t.Helper()
	db := e.DB(t)
	name := e.Table(t, db)
	e.Middleware(t, db, name, "retention")
	tab, err := dialect.ParseTable(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range mysql.New().HorizonSchemaSQL(tab) {
		if _, err := db.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	return db, name, tab
}

// mysqlConn returns a session of its own.
func mysqlConn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// mysqlTryLock runs CleanupLockSQL for tab on c.
func mysqlTryLock(t *testing.T, c *sql.Conn, tab dialect.Table) bool {
	t.Helper()
	var got bool
	q, args := mysql.New().CleanupLockSQL(tab)
	if err := c.QueryRowContext(context.Background(), q, args...).Scan(&got); err != nil {
		t.Fatalf("CleanupLockSQL: %v", err)
	}
	return got
}

// mysqlSessionVar reads a session variable (or user variable) on c.
func mysqlSessionVar(t *testing.T, c *sql.Conn, v string) string {
	t.Helper()
	var s sql.NullString
	if err := c.QueryRowContext(context.Background(), "SELECT "+v).Scan(&s); err != nil {
		t.Fatalf("SELECT %s: %v", v, err)
	}
	return s.String
}

// mysqlCleanupLockNamesTheTable: the lock of "t" in the session's
// database is the lock of "db.t", and not that of the same name in another
// database; the holder's release frees it, and a lock the session already
// holds (a release that did not run) is not taken twice, so one release
// frees it.
func mysqlCleanupLockNamesTheTable(t *testing.T, e *dialecttest.Env) {
	db, _, tab := mysqlRetentionTable(t, e)
	d := mysql.New()
	a, b := mysqlConn(t, db), mysqlConn(t, db)
	schema := mysqlSessionVar(t, a, "DATABASE()")
	qualified := dialect.Table{Schema: schema, Name: tab.Name}
	elsewhere := dialect.Table{Schema: schema + "_elsewhere", Name: tab.Name}
	if !mysqlTryLock(t, a, tab) {
		t.Fatal("the first session did not get the lock")
	}
	if mysqlTryLock(t, b, qualified) {
		t.Fatalf("%s and %s took two locks: one table, two spellings", tab, qualified)
	}
	if !mysqlTryLock(t, b, elsewhere) {
		t.Fatalf("the table of the same name in another database (%s) shares the lock", elsewhere)
	}
	// Again on the holder: no second hold.
	if !mysqlTryLock(t, a, qualified) {
		t.Fatal("the holder does not get its own lock again")
	}
	for _, c := range []*sql.Conn{a, b} {
		for _, tb := range []dialect.Table{tab, elsewhere} {
			s, args := d.ReleaseCleanupSQL(tb)
			if _, err := c.ExecContext(context.Background(), s, args...); err != nil {
				t.Fatalf("ReleaseCleanupSQL: %v", err)
			}
		}
	}
	if !mysqlTryLock(t, b, tab) {
		t.Fatal("after one release by the holder the lock is still held: it was taken twice")
	}
	s, args := d.ReleaseCleanupSQL(tab)
	if _, err := b.ExecContext(context.Background(), s, args...); err != nil {
		t.Fatal(err)
	}
}

// mysqlCleanupBatchTimesOut: on MariaDB, a batch's DELETE that runs longer
// than StatementTimeoutSQL's limit fails with error 1969, which
// IsStatementTimeout reports; it deletes nothing, and it changes nothing of
// the session (max_statement_time) for the statements after it.
func mysqlCleanupBatchTimesOut(t *testing.T, e *dialecttest.Env) {
	db, name, tab := mysqlRetentionTable(t, e)
	d := mysql.New()
	c := mysqlConn(t, db)
	if !strings.Contains(mysqlSessionVar(t, c, "VERSION()"), "MariaDB") {
		t.Skip("MySQL has no time limit for a DELETE: its max_execution_time bounds SELECTs only")
	}
	if _, err := db.Exec("INSERT INTO " + name + " (consumer, message_key, processed_at) SELECT 'c', CONCAT('k', seq), '2020-01-01' FROM seq_1_to_20000"); err != nil {
		t.Fatal(err)
	}
	before := mysqlSessionVar(t, c, "@@SESSION.max_statement_time")
	ctx := context.Background()
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// A microsecond: a DELETE of 20,000 rows takes milliseconds.
	if _, err := tx.ExecContext(ctx, d.StatementTimeoutSQL(time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	s, args := d.CleanupBatchSQL(tab, "", time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC), 20000)
	_, err = tx.ExecContext(ctx, s, args...)
	var me *gomysql.MySQLError
	if !d.IsStatementTimeout(err) || !errors.As(err, &me) || me.Number != 1969 {
		t.Fatalf("a batch past its time limit: %v; want error 1969, a statement timeout", err)
	}
	s, args = d.ReleaseCleanupSQL(tab)
	if _, err := tx.ExecContext(ctx, s, args...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if after := mysqlSessionVar(t, c, "@@SESSION.max_statement_time"); after != before {
		t.Errorf("max_statement_time of the session is %s after the batch, was %s", after, before)
	}
	if _, err := c.ExecContext(ctx, "SELECT SLEEP(0.01)"); err != nil {
		t.Errorf("a later statement on the session is cut short: %v", err)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + name).Scan(&n); err != nil || n != 20000 {
		t.Fatalf("%d claims left after the timed-out batch (%v), want 20000", n, err)
	}
}

// mysqlMaintenanceLock: MaintenanceLockSQL takes the maintenance lock and
// bounds the metadata-lock wait of the DDL after it; ReleaseMaintenanceSQL
// frees the lock and restores lock_wait_timeout and
// innodb_lock_wait_timeout (which the maintenance transaction shortens with
// LockTimeoutSQL) to the session's own values.
func mysqlMaintenanceLock(t *testing.T, e *dialecttest.Env) {
	db, _, tab := mysqlRetentionTable(t, e)
	d := mysql.New()
	a, b := mysqlConn(t, db), mysqlConn(t, db)
	ctx := context.Background()
	ownLock, ownInno := mysqlSessionVar(t, a, "@@SESSION.lock_wait_timeout"), mysqlSessionVar(t, a, "@@SESSION.innodb_lock_wait_timeout")
	if _, err := a.ExecContext(ctx, d.MaintenanceLockSQL(tab)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ExecContext(ctx, d.LockTimeoutSQL(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := mysqlSessionVar(t, a, "@@SESSION.lock_wait_timeout"); got != fmt.Sprint(int(mysql.PartitionLockWait/time.Second)) {
		t.Errorf("lock_wait_timeout under the maintenance lock = %s, want %v", got, mysql.PartitionLockWait)
	}
	name := "CONCAT('idempotent:partitions:', SHA1(CONCAT(DATABASE(), '.', '" + tab.Name + "')))"
	if holder := mysqlSessionVar(t, b, "IS_USED_LOCK("+name+") = "+mysqlSessionVar(t, a, "CONNECTION_ID()")); holder != "1" {
		t.Fatalf("another session does not see the maintenance lock held by the first (%s)", holder)
	}
	s, args := d.ReleaseMaintenanceSQL(tab)
	if _, err := a.ExecContext(ctx, s, args...); err != nil {
		t.Fatal(err)
	}
	if got := mysqlSessionVar(t, b, "IS_USED_LOCK("+name+")"); got != "" {
		t.Errorf("the maintenance lock is still held by %s after the release", got)
	}
	if got := mysqlSessionVar(t, a, "@@SESSION.lock_wait_timeout"); got != ownLock {
		t.Errorf("lock_wait_timeout after the release = %s, want the session's own %s", got, ownLock)
	}
	if got := mysqlSessionVar(t, a, "@@SESSION.innodb_lock_wait_timeout"); got != ownInno {
		t.Errorf("innodb_lock_wait_timeout after the release = %s, want the session's own %s", got, ownInno)
	}
}

// mysqlPartitionDDLWaitIsBounded: a partition's ALTER TABLE behind an open
// claim transaction (which holds the table's metadata lock) gives up with
// error 1205 after PartitionLockWait instead of waiting, with every new
// claim queued behind it, for as long as the handler takes.
func mysqlPartitionDDLWaitIsBounded(t *testing.T, e *dialecttest.Env) {
	db := e.DB(t)
	name := e.Table(t, db)
	tab, err := dialect.ParseTable(name)
	if err != nil {
		t.Fatal(err)
	}
	d := mysql.New()
	for _, s := range d.PartitionedSchemaSQL(tab) {
		if _, err := db.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Date(2031, 3, 14, 0, 0, 0, 0, time.UTC)
	if _, err := db.Exec(d.CreatePartitionSQL(tab, day)); err != nil {
		t.Fatal(err)
	}
	// Not an assertion on time: without the bound the ALTER TABLE would
	// wait a day (lock_wait_timeout's default); this ends the test instead.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claim, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Rollback()
	if _, err := claim.ExecContext(ctx, d.ClaimAtSQL(tab), "c", "k", day.Format(time.DateOnly)); err != nil {
		t.Fatal(err)
	}
	m := mysqlConn(t, db)
	if _, err := m.ExecContext(ctx, d.MaintenanceLockSQL(tab)); err != nil {
		t.Fatal(err)
	}
	_, err = m.ExecContext(ctx, d.CreatePartitionSQL(tab, day.AddDate(0, 0, 1)))
	var me *gomysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1205 || d.Classify(err).Kind != dialect.KindLockTimeout {
		t.Fatalf("ADD PARTITION behind an open claim: %v; want error 1205 (lock wait timeout)", err)
	}
	s, args := d.ReleaseMaintenanceSQL(tab)
	if _, err := m.ExecContext(ctx, s, args...); err != nil {
		t.Fatal(err)
	}
	if err := claim.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ExecContext(ctx, d.CreatePartitionSQL(tab, day.AddDate(0, 0, 1))); err != nil {
		t.Fatalf("ADD PARTITION once the claim committed: %v", err)
	}
	if _, err := m.ExecContext(ctx, d.DropPartitionSQL(tab, d.PartitionName(tab, day))); err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(d.ClaimAtSQL(tab), "c", "k2", day.Format(time.DateOnly))
	if !d.IsNoPartition(err) {
		t.Fatalf("a claim for a dropped day: %v; want error 1526", err)
	}
}

// mysqlCleanupUsesTheProcessedAtIndex: the batch picks its rows from the
// processed_at index, for every consumer and for one, rather than reading
// a consumer's claims by primary key and sorting them.
func mysqlCleanupUsesTheProcessedAtIndex(t *testing.T, e *dialecttest.Env) {
	db, name, tab := mysqlRetentionTable(t, e)
	if _, err := db.Exec("INSERT INTO " + name + " (consumer, message_key, processed_at) SELECT 'c', CONCAT('k', seq), IF(seq <= 1000, '2020-01-01', '2030-01-01') FROM seq_1_to_20000"); err != nil {
		t.Skipf("no seq_ table engine (MySQL): %v", err)
	}
	if _, err := db.Exec("ANALYZE TABLE " + name); err != nil {
		t.Fatal(err)
	}
	for _, consumer := range []string{"", "c"} {
		s, args := mysql.New().CleanupBatchSQL(tab, consumer, time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC), 500)
		s = s[strings.Index(s, "DELETE"):] // EXPLAIN of the DELETE itself
		rows, err := db.Query("EXPLAIN "+s, args...)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		var plan []string
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			row := map[string]string{}
			for i, c := range cols {
				row[c] = vals[i].String
			}
			plan = append(plan, fmt.Sprintf("%s %s key=%s %s", row["select_type"], row["table"], row["key"], row["Extra"]))
			if row["select_type"] == "DERIVED" && (row["key"] != tab.Name+"_processed_at" || strings.Contains(row["Extra"], "filesort")) {
				t.Errorf("consumer %q: the batch's rows are picked by %q (%s), want the processed_at index without a sort", consumer, row["key"], row["Extra"])
			}
		}
		rows.Close()
		t.Logf("consumer %q: %s", consumer, strings.Join(plan, "; "))
	}
}
