package dialect

import "time"

// ObjectKind is the kind of a [SchemaObject].
type ObjectKind int

const (
	// ObjectTable is a table.
	ObjectTable ObjectKind = iota + 1
	// ObjectIndex is an index of a table.
	ObjectIndex
)

// String returns "table" or "index".
func (k ObjectKind) String() string {
	switch k {
	case ObjectTable:
		return "table"
	case ObjectIndex:
		return "index"
	}
	return "unknown"
}

// SchemaObject is one object that a claim table needs: the table itself,
// an index of it, or a companion table.
type SchemaObject struct {
	// Kind says what the object is.
	Kind ObjectKind
	// Table is the table the object is (ObjectTable) or indexes
	// (ObjectIndex).
	Table Table
	// Name is an index's name, unquoted; it lives in Table's schema. It is
	// "" for a table.
	Name string
	// CreateSQL is the statement that creates the object. It runs only
	// when the catalog says the object is missing, in the transaction
	// described at [SchemaInspector].
	CreateSQL string
}

// String names the object for error messages, such as "table app.claims"
// or "index claims_processed_at of app.claims".
func (o SchemaObject) String() string {
	if o.Kind == ObjectIndex {
		return "index " + o.Name + " of " + o.Table.String()
	}
	return o.Kind.String() + " " + o.Table.String()
}

// SchemaInspector is an optional interface of a [Dialect] whose database
// tells from its catalog, without waiting for any lock a transaction on the
// claim table holds, which of the claim table's objects exist. EnsureSchema
// then sends no DDL when everything exists, so that running it on every
// start of every process never queues behind an open claim — and never
// makes new claims queue behind it (on Postgres even CREATE INDEX IF NOT
// EXISTS locks the table before it looks for the index).
//
// When objects are missing, EnsureSchema creates them in one transaction:
// SchemaLockSQL, then the statement of DDLLockTimeoutSQL, then, for each
// object in order, ObjectExistsSQL again and CreateSQL if it is still
// missing. A CreateSQL that fails is forgiven when ObjectExistsSQL then
// finds the object (another process created it meanwhile, on a database
// without SchemaLockSQL). When the transaction gives up waiting for a lock
// (IsDDLLockTimeout), EnsureSchema reports that it did and that it is safe
// to run again.
//
// A dialect without this interface has its SchemaSQL (or
// PartitionedSchemaSQL) run as it is on every EnsureSchema.
type SchemaInspector interface {
	// SchemaObjects returns the objects of claim table t, plain or
	// partitioned by event day (see [Partitioner]), in the order they must
	// be created. A new object the claim table comes to need is one more
	// element here.
	SchemaObjects(t Table, partitioned bool) []SchemaObject

	// ObjectExistsSQL returns a query yielding one row with one boolean:
	// whether o exists. It must read the catalog only, and find a table the
	// way the claim statements' unqualified names do.
	ObjectExistsSQL(o SchemaObject) (query string, args []any)

	// SchemaLockSQL returns the statement run first in the creating
	// transaction that serialises EnsureSchema on t between processes until
	// the transaction ends, or "" when the database needs none.
	SchemaLockSQL(t Table) string

	// DDLLockTimeoutSQL returns the statement, run in the creating
	// transaction after SchemaLockSQL and before any CreateSQL, that makes
	// each later lock wait give up after d, or "" when the wait is bounded
	// otherwise (SQLite's busy timeout). session reports that the setting
	// outlives the transaction: the middleware then runs the transaction
	// on a connection of its own and closes it afterwards, instead of
	// returning it to the pool with the setting.
	DDLLockTimeoutSQL(d time.Duration) (stmt string, session bool)

	// IsDDLLockTimeout reports whether err, from the creating transaction's
	// begin, one of its statements or its commit, says that a lock wait
	// gave up.
	IsDDLLockTimeout(err error) bool
}

// ClaimTableObjects returns what EnsureSchema looks for and creates for
// claim table t: insp's SchemaObjects and, where d keeps a retention
// horizon (HorizonKeeper) and insp does not list its table, the horizon
// table, once for each of its HorizonSchemaSQL statements.
func ClaimTableObjects(d Dialect, insp SchemaInspector, t Table, partitioned bool) []SchemaObject {
	objs := insp.SchemaObjects(t, partitioned)
	hk, ok := d.(HorizonKeeper)
	if !ok {
		return objs
	}
	ht := hk.HorizonTable(t)
	for _, o := range objs {
		if o.Table == ht {
			return objs
		}
	}
	objs = objs[:len(objs):len(objs)]
	for _, stmt := range hk.HorizonSchemaSQL(t) {
		objs = append(objs, SchemaObject{Kind: ObjectTable, Table: ht, CreateSQL: stmt})
	}
	return objs
}
