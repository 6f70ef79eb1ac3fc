package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
)

var (
	_ dialect.ImplicitCommitter  = (*Dialect)(nil)
	_ dialect.ImplicitRollbacker = (*Dialect)(nil)
	_ dialect.TxOptionsChecker   = (*Dialect)(nil)
)

// RollsBackImplicitly reports the failures after which InnoDB has rolled
// the whole transaction back and the session runs in autocommit mode: a
// deadlock (1213) and MariaDB's write conflict under
// innodb_snapshot_isolation (1020). A lock wait timeout (1205) rolls back
// only the statement, unless the server runs with
// innodb_rollback_on_timeout, which the text of an error does not tell;
// it is not reported.
func (*Dialect) RollsBackImplicitly(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == errLockDeadlock || me.Number == errCheckRead)
}

// CommitsImplicitly reports whether MySQL or MariaDB commits the current
// transaction to run query's first statement. It follows the MySQL manual's
// "Statements That Cause an Implicit Commit":
//
//   - DDL: every ALTER, CREATE, DROP, RENAME and TRUNCATE (tables,
//     databases, indexes, views, procedures, functions, triggers, events,
//     servers, tablespaces, sequences, users, roles), except CREATE
//     TEMPORARY TABLE, DROP TEMPORARY TABLE and DROP PREPARE;
//   - INSTALL and UNINSTALL (plugins);
//   - account management: GRANT, REVOKE, SET PASSWORD (CREATE, ALTER, DROP
//     and RENAME USER are DDL above);
//   - transaction control and locking: BEGIN, START TRANSACTION (and START
//     SLAVE or REPLICA), LOCK TABLES, UNLOCK TABLES, and a SET that turns
//     autocommit on;
//   - administration: ANALYZE TABLE (not MariaDB's ANALYZE SELECT), CHECK
//     TABLE, OPTIMIZE TABLE, REPAIR TABLE, CACHE INDEX, LOAD INDEX INTO
//     CACHE, FLUSH, RESET (not RESET PERSIST);
//   - replication control: STOP, CHANGE MASTER and CHANGE REPLICATION.
//
// Leading white space and comments (-- , # and /* */) are skipped; the
// text of an executable comment (/*! … */, MariaDB's /*M! … */) is read as
// the statement it is. LOAD DATA commits implicitly only into an NDB table,
// which the text does not tell, so it is let through. Only the first
// statement of a multi-statement string is looked at; the strict guard
// (WithStrictGuard, on MariaDB) catches the others. CommitsImplicitly does
// not allocate.
func (*Dialect) CommitsImplicitly(query string) bool {
	s := scanner{rest: query}
	is := strings.EqualFold
	switch w := s.word(); {
	case is(w, "ALTER"), is(w, "RENAME"), is(w, "TRUNCATE"), is(w, "INSTALL"), is(w, "UNINSTALL"),
		is(w, "GRANT"), is(w, "REVOKE"), is(w, "BEGIN"), is(w, "START"), is(w, "STOP"), is(w, "CHANGE"),
		is(w, "CHECK"), is(w, "OPTIMIZE"), is(w, "REPAIR"), is(w, "FLUSH"), is(w, "CACHE"):
		return true
	case is(w, "CREATE"):
		// CREATE [OR REPLACE] TEMPORARY TABLE does not commit.
		next := s.word()
		if is(next, "OR") && is(s.word(), "REPLACE") {
			next = s.word()
		}
		return !is(next, "TEMPORARY")
	case is(w, "DROP"):
		next := s.word()
		return !is(next, "TEMPORARY") && !is(next, "PREPARE")
	case is(w, "LOCK"), is(w, "UNLOCK"):
		next := s.word()
		return is(next, "TABLES") || is(next, "TABLE")
	case is(w, "ANALYZE"):
		// ANALYZE [NO_WRITE_TO_BINLOG | LOCAL] TABLE; MariaDB's ANALYZE
		// SELECT/UPDATE/DELETE and ANALYZE FORMAT=JSON … run a statement.
		next := s.word()
		return is(next, "TABLE") || is(next, "TABLES") || is(next, "NO_WRITE_TO_BINLOG") || is(next, "LOCAL")
	case is(w, "LOAD"):
		return is(s.word(), "INDEX")
	case is(w, "RESET"):
		return !is(s.word(), "PERSIST")
	case is(w, "SET"):
		return setCommits(&s)
	}
	return false
}

// setCommits reports whether the rest of a SET statement sets a password or
// turns autocommit on (SET autocommit = 1, SET @@SESSION.autocommit = ON,
// …). SET autocommit = 0 inside a transaction commits nothing.
func setCommits(s *scanner) bool {
	is := strings.EqualFold
	w := s.word()
	if is(w, "PASSWORD") {
		return true
	}
	// Find autocommit as a word anywhere in the assignments.
	for ; ; w = s.word() {
		if w == "" {
			if !s.skipOne() {
				return false
			}
			continue
		}
		if !is(w, "autocommit") {
			continue
		}
		s.rest = skipSpaceAndComments(s.rest)
		s.rest = strings.TrimPrefix(s.rest, ":")
		if !strings.HasPrefix(s.rest, "=") {
			continue
		}
		s.rest = skipSpaceAndComments(s.rest[1:])
		if strings.HasPrefix(s.rest, "0") && (len(s.rest) == 1 || !isWordByte(s.rest[1])) {
			return false
		}
		if v := s.word(); is(v, "OFF") || is(v, "FALSE") {
			return false
		}
		return true
	}
}

// scanner reads the keywords of one statement without allocating.
type scanner struct{ rest string }

// word returns the next word (letters, digits, _, $, and the dots and @ of
// a system variable such as @@SESSION.autocommit, whose last part it
// returns) as written, or "" when the next thing is not a word or the
// statement has ended.
func (s *scanner) word() string {
	s.rest = skipSpaceAndComments(s.rest)
	r := s.rest
	i := 0
	switch {
	case strings.HasPrefix(r, "@@"):
		// A system variable: @@name or @@scope.name; return the name.
		r = r[2:]
	case strings.HasPrefix(r, "@"):
		// A user variable: @name, returned with its @.
		i = 1
	}
	for i < len(r) && isWordByte(r[i]) {
		i++
	}
	w := r[:i]
	r = r[i:]
	for len(w) > 0 && strings.HasPrefix(r, ".") {
		r = r[1:]
		i = 0
		for i < len(r) && isWordByte(r[i]) {
			i++
		}
		w = r[:i]
		r = r[i:]
	}
	if w == "" || w == "@" {
		return ""
	}
	s.rest = r
	return w
}

// skipOne skips one byte that is not part of a word (an operator, a quote,
// a comma), or a whole quoted string, and reports whether the statement
// goes on.
func (s *scanner) skipOne() bool {
	r := skipSpaceAndComments(s.rest)
	if r == "" || r[0] == ';' {
		s.rest = ""
		return false
	}
	switch q := r[0]; q {
	case '\'', '"', '`':
		i := 1
		for i < len(r) && r[i] != q {
			if r[i] == '\\' {
				i++
			}
			i++
		}
		if i >= len(r) {
			s.rest = ""
			return false
		}
		s.rest = r[i+1:]
	default:
		s.rest = r[1:]
	}
	return true
}

func isWordByte(b byte) bool {
	return b|0x20 >= 'a' && b|0x20 <= 'z' || b >= '0' && b <= '9' || b == '_' || b == '$' || b >= 0x80
}

// skipSpaceAndComments drops leading white space, -- and # comments and
// /* */ comments; it enters an executable comment (/*!50100 …, /*M!100300
// …) so that its text is read as the statement it is.
func skipSpaceAndComments(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\r\n\f")
		switch {
		case strings.HasPrefix(s, "--"), strings.HasPrefix(s, "#"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*!"), strings.HasPrefix(s, "/*M!"):
			s = s[strings.IndexByte(s, '!')+1:]
			s = strings.TrimLeft(s, "0123456789")
		case strings.HasPrefix(s, "*/"):
			// The end of an executable comment entered above.
			s = s[2:]
		case strings.HasPrefix(s, "/*"):
			i := strings.Index(s, "*/")
			if i < 0 {
				return ""
			}
			s = s[i+2:]
		default:
			return s
		}
	}
}

// CheckTxOptions accepts the isolation levels go-sql-driver/mysql can begin
// — sql.LevelDefault, LevelReadUncommitted, LevelReadCommitted,
// LevelRepeatableRead and LevelSerializable — and refuses the others
// (LevelSnapshot, LevelWriteCommitted, LevelLinearizable), which the driver
// rejects at every BeginTx. A read-only transaction cannot insert a claim.
func (*Dialect) CheckTxOptions(o sql.TxOptions) error {
	if o.ReadOnly {
		return fmt.Errorf("mysql dialect: a read-only transaction cannot insert a claim")
	}
	switch o.Isolation {
	case sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
		return nil
	}
	return fmt.Errorf("mysql dialect: isolation level %v is not supported by MySQL, MariaDB or go-sql-driver/mysql (use Default, Read Uncommitted, Read Committed, Repeatable Read or Serializable)", o.Isolation)
}
