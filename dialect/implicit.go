package dialect

// ImplicitCommitter is an optional interface of a [Dialect] whose database
// commits the open transaction by itself before (or after) running certain
// statements — MySQL and MariaDB do so for DDL, LOCK TABLES, account
// management and a few administrative statements. Such a statement run by a
// handler through the claim's transaction would commit the claim together
// with the part of the effect run so far, and everything after it would
// commit statement by statement: a handler that then failed could never be
// redelivered (its claim exists) nor rolled back.
//
// A connection opened through idempotent.GuardConnector asks
// CommitsImplicitly about every statement the handler sends through the
// claim's transaction, and refuses, with idempotent.ErrAutocommit, those for
// which it returns true, before they reach the database.
//
// Dialects whose DDL is transactional (Postgres, SQLite) do not implement
// it.
type ImplicitCommitter interface {
	// CommitsImplicitly reports whether the database would commit the
	// current transaction to run query. It looks at the first statement of
	// query only, after leading white space and comments. It is called for
	// every statement a handler runs, so it must not allocate.
	CommitsImplicitly(query string) bool
}
