package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Identifier = (*Dialect)(nil)

// identitySQL names the file holding the claim table: parameter 1 is the
// table's schema, "main" or the name of an attached database. SQLite gives
// the file's absolute path, and "" for an in-memory or temporary database.
const identitySQL = "SELECT file FROM pragma_database_list WHERE name = ?"

// process is drawn once per process: SQLite runs inside the process, so
// the process's start is the database engine's start.
var process = func() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}()

// Identity names the claim table t for the duplicate pre-check: "sqlite
// table <schema>.<table> file <absolute path of the database file>
// process <16 hex digits>". The last is a random number the package draws
// once per process. It only reads.
//
// SQLite has no server: the database engine starts with the process that
// opens the file, so the process stands for the server's start. The path
// tells apart the databases of one host; the number tells apart
// processes, and so two hosts whose databases have the same path, and the
// same file before and after a restart of the process. Nothing in a SQLite
// file can tell it from a copy restored over it (an identifier stored in
// the database would be copied with it), so stop the consumers while
// restoring the file, as SQLite needs anyway (a connection that stays open
// across the copy goes on with the file it opened): once restarted they
// use a new scope and find nothing from before. Two processes on one file
// share no scope either: a message one of them recorded is a miss for the
// other, which its claim then answers.
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
	return "sqlite table " + schema + "." + t.Name + " file " + file + " process " + process, nil
}
