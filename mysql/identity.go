package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Identifier = (*Dialect)(nil)

// The queries Identity runs: the server's kind, then the name. The server's
// own identifier is @@server_uuid on MySQL (made when the data directory
// was initialized, and copied with it) and @@server_uid on MariaDB (a hash
// of the host's hardware address and the port); neither server knows the
// other's variable. The server's start is UNIX_TIMESTAMP() less the Uptime
// status variable, read in the same statement: the server computes Uptime
// as the statement's own start (which UNIX_TIMESTAMP() returns) less the
// second it started, so the difference is that second exactly, on every
// read. MariaDB shows Uptime in information_schema.GLOBAL_STATUS, MySQL 8
// in performance_schema.global_status. Parameters 1 and 2 are the table's
// schema ("" for the connection's default database) and name; no row
// comes back when the table does not exist, and a NULL when the server
// shows no Uptime.
const (
	identityKindSQL = "SELECT VERSION()"
	identityTail    = ", ' host ', @@hostname, ':', @@port, ' start ', (SELECT UNIX_TIMESTAMP() - CAST(VARIABLE_VALUE AS SIGNED) FROM %s WHERE VARIABLE_NAME = 'Uptime')" +
		", ' table ', t.TABLE_SCHEMA, '.', t.TABLE_NAME, ' created ', COALESCE(t.CREATE_TIME, ''))" +
		" FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND t.TABLE_NAME = ?"
)

var (
	mysqlIdentitySQL   = "SELECT CONCAT('mysql server ', @@server_uuid" + fmt.Sprintf(identityTail, "performance_schema.global_status")
	mariadbIdentitySQL = "SELECT CONCAT('mariadb server ', @@server_uid" + fmt.Sprintf(identityTail, "information_schema.GLOBAL_STATUS")
)

// Identity names the claim table t for the duplicate pre-check: "mysql
// server <@@server_uuid>" (or "mariadb server <@@server_uid>"), "host
// <hostname>:<port>", "start <the second the server started, since
// 1970>", "table <database>.<table>" and "created <the table's
// CREATE_TIME>". It runs two queries: VERSION(), to tell MariaDB from
// MySQL, then the name.
//
// The name changes whenever the database could have lost claims that a
// pre-check remembers, because every such event starts a server or
// re-creates the table:
//
//   - A restart starts a server: a new start. So does every way to put
//     back a data directory — a physical backup (mariabackup, xtrabackup,
//     MySQL Enterprise Backup) or a snapshot started as it is, the restore
//     a binary-log point-in-time recovery begins with — and an upgrade.
//   - A physical clone (a copied data directory, the clone plugin, a
//     replica promoted) has a start of its own, and mostly another host,
//     port and identifier (MySQL's @@server_uuid is copied with the data
//     directory unless auto.cnf is removed): it does not share a scope
//     with the original unless both started in the same second on one
//     host name and port.
//   - A claim table re-created, as restoring a dump does, has a new
//     creation time (to the second). Claims deleted by hand, or a TRUNCATE
//     (which keeps the creation time) before loading data back, change
//     nothing: clear the pre-check then (see idempotent.Seen).
//   - Another server has another identifier and, mostly, another host;
//     another database or table another name.
//
// Each gives a new scope, so entries recorded before it are not consulted
// after it, once the middleware has read the name again (see
// idempotent.Middleware.SeenScope). The pre-check is therefore cold after
// every server restart.
//
// A MariaDB without @@server_uid gets an error (unknown system variable),
// and a server that shows no Uptime to the middleware's user an error
// saying so: the middleware leaves the pre-check out.
func (d *Dialect) Identity(ctx context.Context, t dialect.Table, q dialect.QueryFunc) (string, error) {
	v, err := q(ctx, identityKindSQL)
	if err != nil {
		return "", fmt.Errorf("mysql dialect: read the identity of %s: %w", t, err)
	}
	query := mysqlIdentitySQL
	if strings.Contains(v, "MariaDB") {
		query = mariadbIdentitySQL
	}
	id, err := q(ctx, query, t.Schema, t.Name)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", fmt.Errorf("mysql dialect: read the identity of %s: the table does not exist (run EnsureSchema first)", t)
	case err != nil:
		return "", fmt.Errorf("mysql dialect: read the identity of %s: %w", t, err)
	case id == "":
		return "", fmt.Errorf("mysql dialect: read the identity of %s: the server does not show its start (the Uptime status variable)", t)
	}
	return id, nil
}
