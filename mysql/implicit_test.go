package mysql

import (
	"database/sql"
	"strings"
	"testing"
)

func TestCommitsImplicitly(t *testing.T) {
	d := New()
	commits := []string{
		"CREATE TABLE t (id INT)",
		"create table if not exists t (id int)",
		"CREATE OR REPLACE TABLE t (id INT)",
		"CREATE DATABASE x", "CREATE SCHEMA x", "CREATE UNIQUE INDEX i ON t (a)",
		"CREATE DEFINER = CURRENT_USER VIEW v AS SELECT 1", "CREATE OR REPLACE VIEW v AS SELECT 1",
		"CREATE PROCEDURE p() BEGIN END", "CREATE FUNCTION f() RETURNS INT RETURN 1",
		"CREATE TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET @x = 1", "CREATE EVENT e ON SCHEDULE EVERY 1 DAY DO SELECT 1",
		"CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (HOST 'h')", "CREATE TABLESPACE ts ADD DATAFILE 'ts.ibd'",
		"CREATE SEQUENCE s", "CREATE USER u", "CREATE ROLE r",
		"ALTER TABLE t ADD COLUMN c INT", "ALTER USER u IDENTIFIED BY 'x'", "ALTER DATABASE x CHARACTER SET utf8mb4",
		"DROP TABLE t", "DROP TABLE IF EXISTS t", "DROP INDEX i ON t", "DROP USER u", "DROP VIEW v",
		"RENAME TABLE a TO b", "RENAME USER a TO b",
		"TRUNCATE TABLE t", "TRUNCATE t",
		"LOCK TABLES t WRITE", "lock table t read", "UNLOCK TABLES",
		"BEGIN", "START TRANSACTION", "START SLAVE", "STOP SLAVE", "CHANGE MASTER TO MASTER_HOST='h'",
		"SET autocommit = 1", "SET autocommit=1", "SET AUTOCOMMIT = ON", "SET @@autocommit = 1",
		"SET SESSION autocommit = 1", "SET @@SESSION.autocommit = true", "SET @x = 1, autocommit = 1",
		"SET @x = 'autocommit', autocommit = 1",
		"SET PASSWORD = 'x'", "SET PASSWORD FOR u = PASSWORD('x')",
		"GRANT SELECT ON *.* TO u", "REVOKE SELECT ON *.* FROM u",
		"ANALYZE TABLE t", "ANALYZE NO_WRITE_TO_BINLOG TABLE t", "ANALYZE LOCAL TABLE t",
		"CHECK TABLE t", "OPTIMIZE TABLE t", "REPAIR TABLE t",
		"CACHE INDEX t IN hot", "LOAD INDEX INTO CACHE t",
		"FLUSH TABLES", "FLUSH PRIVILEGES", "RESET QUERY CACHE", "RESET MASTER",
		"INSTALL PLUGIN p SONAME 'p.so'", "UNINSTALL PLUGIN p",
		// Comments and white space first.
		"  \n\tCREATE TABLE t (id INT)",
		"-- a comment\nCREATE TABLE t (id INT)",
		"# a comment\nTRUNCATE t",
		"/* a comment */ /* another */ ALTER TABLE t ADD c INT",
		"/*!40101 LOCK TABLES t WRITE */",
		"/*M!100300 CREATE TABLE t (id INT) */",
		"/*!*/ DROP TABLE t",
	}
	keeps := []string{
		"", "   ", "-- only a comment", "/* unterminated",
		"INSERT INTO t VALUES (1)", "UPDATE t SET a = 1", "DELETE FROM t", "SELECT 1", "REPLACE INTO t VALUES (1)",
		"INSERT INTO created_table VALUES (1)", "SELECT 'CREATE TABLE t'", "/* CREATE TABLE t */ SELECT 1",
		"-- DROP TABLE t\nSELECT 1", "# TRUNCATE t\nSELECT 1",
		"CREATE TEMPORARY TABLE t (id INT)", "create or replace temporary table t (id int)",
		"DROP TEMPORARY TABLE t", "DROP TEMPORARY TABLE IF EXISTS t", "DROP PREPARE s",
		"SET autocommit = 0", "SET autocommit=0", "SET autocommit = OFF", "SET @@SESSION.autocommit = false",
		"SET @autocommit = 1", "SET @x = 'autocommit = 1'", "SET innodb_lock_wait_timeout = 5",
		"SET SESSION innodb_lock_wait_timeout = CAST(@idempotent_lock_wait_timeout AS UNSIGNED)",
		"SET @idempotent_lock_wait_timeout = CAST(COALESCE(@idempotent_lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout) AS UNSIGNED), SESSION innodb_lock_wait_timeout = 2",
		"LOCK INSTANCE FOR BACKUP", "UNLOCK INSTANCE",
		"ANALYZE SELECT * FROM t", "ANALYZE FORMAT=JSON SELECT 1",
		"LOAD DATA LOCAL INFILE 'x' INTO TABLE t", "RESET PERSIST",
		"SAVEPOINT s", "ROLLBACK TO SAVEPOINT s", "RELEASE SAVEPOINT s",
		"CALL p()", "DO SLEEP(0)", "SELECT @@in_transaction",
		"CHECKSUM TABLE t", "STARTS", "BEGINNING",
	}
	for _, q := range commits {
		if !d.CommitsImplicitly(q) {
			t.Errorf("CommitsImplicitly(%q) = false, want true", q)
		}
	}
	for _, q := range keeps {
		if d.CommitsImplicitly(q) {
			t.Errorf("CommitsImplicitly(%q) = true, want false", q)
		}
	}
}

// TestCommitsImplicitlyDoesNotAllocate: the guard asks about every
// statement a handler runs.
func TestCommitsImplicitlyDoesNotAllocate(t *testing.T) {
	d := New()
	for _, q := range []string{
		"INSERT INTO t (a, b) VALUES (?, ?)", "/* c */ UPDATE t SET a = 1",
		"SET @x = 'autocommit', autocommit = 0", "CREATE TABLE t (id INT)",
		strings.Repeat(" ", 100) + "SELECT 1",
	} {
		if n := testing.AllocsPerRun(100, func() { d.CommitsImplicitly(q) }); n != 0 {
			t.Errorf("CommitsImplicitly(%q) allocates %v times", q, n)
		}
	}
}

func TestCheckTxOptions(t *testing.T) {
	d := New()
	for _, l := range []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		if err := d.CheckTxOptions(sql.TxOptions{Isolation: l}); err != nil {
			t.Errorf("%v: %v", l, err)
		}
	}
	for _, l := range []sql.IsolationLevel{sql.LevelSnapshot, sql.LevelWriteCommitted, sql.LevelLinearizable, 42} {
		err := d.CheckTxOptions(sql.TxOptions{Isolation: l})
		if err == nil || !strings.Contains(err.Error(), l.String()) || !strings.Contains(err.Error(), "mysql") {
			t.Errorf("%v: %v, want an error naming the level and the dialect", l, err)
		}
	}
	if err := d.CheckTxOptions(sql.TxOptions{ReadOnly: true}); err == nil {
		t.Error("ReadOnly accepted")
	}
}
