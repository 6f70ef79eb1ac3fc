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
// was initialized) and @@server_uid on MariaDB (a hash of the host's
// hardware address and the port); neither server knows the other's
// variable. Parameters 1 and 2 are the table's schema ("" for the
// connection's default database) and name; no row comes back when the
// table does not exist.
const (
	identityKindSQL = "SELECT VERSION()"
	identityTail    = ", ' host ', @@hostname, ':', @@port" +
		", ' table ', t.TABLE_SCHEMA, '.', t.TABLE_NAME, ' created ', COALESCE(t.CREATE_TIME, ''))" +
		" FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND t.TABLE_NAME = ?"
	mysqlIdentitySQL   = "SELECT CONCAT('mysql server ', @@server_uuid" + identityTail
	mariadbIdentitySQL = "SELECT CONCAT('mariadb server ', @@server_uid" + identityTail
)

// Identity names the claim table t for the duplicate pre-check: "mysql
// server <@@server_uuid>" (or "mariadb server <@@server_uid>"), "host
// <hostname>:<port>", "table <database>.<table>" and "created <the
// table's CREATE_TIME>". It runs two queries: VERSION(), to tell MariaDB
// from MySQL, then the name.
//
//   - Another server has another identifier and, mostly, another host;
//     another database or table another name: none shares a scope.
//   - A claim table re-created, as restoring a dump does, has a new
//     creation time (to the second), so it gets a new scope and entries
//     recorded before it are not consulted after it. MySQL and MariaDB
//     have nothing like Postgres's timeline: a binary-log point-in-time
//     recovery into the existing table, or a data directory copied back by
//     a physical backup tool, may keep the name (see idempotent.Seen on
//     restores).
//   - A replica that is promoted has its own identifier.
//
// A MariaDB without @@server_uid gets an error (unknown system variable),
// and the middleware leaves the pre-check out.
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
	if errors.Is(err, sql.ErrNoRows) || (err == nil && id == "") {
		return "", fmt.Errorf("mysql dialect: read the identity of %s: the table does not exist (run EnsureSchema first)", t)
	}
	if err != nil {
		return "", fmt.Errorf("mysql dialect: read the identity of %s: %w", t, err)
	}
	return id, nil
}
