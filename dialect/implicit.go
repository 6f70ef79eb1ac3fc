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

// ImplicitRollbacker is an optional interface of a [Dialect] whose database
// rolls the whole open transaction back by itself when certain statements
// fail, and leaves it: the session is then outside any transaction, and
// every statement after it commits on its own. InnoDB does so for a
// deadlock (MySQL and MariaDB error 1213) and for MariaDB's write conflict
// under innodb_snapshot_isolation (1020). A handler that swallowed such an
// error and went on would write outside the claim's transaction, and one
// that returned nil would have its delivery reported with nothing of it
// committed.
//
// A connection opened through idempotent.GuardConnector asks
// RollsBackImplicitly about every failure of a statement the handler sends
// through the claim's transaction; after one for which it returns true, it
// refuses every further statement of that attempt with
// idempotent.ErrAutocommit, before it reaches the database, and the attempt
// fails even if the handler returns nil.
//
// Postgres and SQLite keep a failed transaction open (Postgres aborts it
// and refuses every statement until it ends), so their dialects do not
// implement it.
type ImplicitRollbacker interface {
	// RollsBackImplicitly reports whether err, a statement's failure,
	// means the database rolled the whole transaction back and left it. It
	// must find the driver's error with errors.As.
	RollsBackImplicitly(err error) bool
}
