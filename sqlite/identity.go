package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Identifier = (*Dialect)(nil)

// identitySQL names the file holding the claim table: parameter 1 is the
// table's schema, "main" or the name of an attached database. SQLite gives
// the file's absolute path, and "" for an in-memory or temporary database.
const identitySQL = "SELECT file FROM pragma_database_list WHERE name = ?"

// Identity names the claim table t for the duplicate pre-check: "sqlite
// table <schema>.<table> file <absolute path of the database file>". It
// only reads.
//
// The path is what tells apart the databases of one host, which is what an
// in-process pre-check (idempotent.SeenLRU) shared by several of them needs.
// It does not tell apart two hosts whose databases have the same path, nor
// a file from the copy restored over it: nothing in a SQLite file does (an
// identifier stored in the database would be copied with it). Two hosts
// that share one pre-check store, such as one Redis, need a key prefix
// each (seenredis.WithPrefix); after restoring a file, clear the pre-check
// (see idempotent.Seen on restores).
//
// An in-memory or temporary database has no path, and Identity returns an
// error: the middleware leaves the pre-check out.
func (d *Dialect) Identity(ctx context.Context, t dialect.Table, q dialect.QueryFunc) (string, error) {
	schema := t.Schema
	if schema == "" {
		schema = "main"
	}
	file, err := q(ctx, identitySQL, schema)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", fmt.Errorf("sqlite dialect: read the identity of %s: no attached database %q", t, schema)
	case err != nil:
		return "", fmt.Errorf("sqlite dialect: read the identity of %s: %w", t, err)
	case file == "":
		return "", fmt.Errorf("sqlite dialect: read the identity of %s: database %q is in memory or temporary, with no file to name it", t, schema)
	}
	return "sqlite table " + schema + "." + t.Name + " file " + file, nil
}
