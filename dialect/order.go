package dialect

// Orderer is implemented by dialects that keep messages of one entity in
// the producer's order (idempotent.WithOrdering). It is optional: a
// Middleware created WithOrdering on a dialect without it is refused by
// idempotent.New with an error naming the dialect.
//
// Ordering needs two tables beside claim table t, both in t's schema:
//
//   - the sequence table, one row per (consumer, order_key) with last_seq,
//     the last sequence number applied (or skipped) for that entity;
//   - the parking table, one row per (consumer, order_key, seq): a message
//     that arrived before its predecessor — its key, payload, headers and
//     event time — or, with state 'S', a tombstone of a sequence an
//     operator skipped.
//
// Times are integers of microseconds since the Unix epoch that the
// middleware computes (0 for no event time), so every dialect stores and
// returns them alike. Every statement takes its values as parameters, in
// the order its method documents, with the dialect's own placeholders.
type Orderer interface {
	// OrderTables returns t's sequence table and parking table.
	OrderTables(t Table) (seq, parked Table)

	// OrderSchemaSQL returns the statements that create both tables if
	// they do not exist, to be run in order, in one transaction, after
	// the claim table's. They must be harmless to run again.
	OrderSchemaSQL(t Table) []string

	// MaxOrderKeyBytes is the longest ordering key, in bytes, the tables
	// can index.
	MaxOrderKeyBytes() int

	// OrderRowSQL inserts the sequence row (consumer, order_key) with
	// last_seq 0 unless it exists, and never fails on a duplicate.
	// Parameters: consumer, order_key.
	OrderRowSQL(t Table) string

	// OrderLockSQL is a query yielding the row's last_seq (an integer) and
	// locking the row until the transaction ends, so that every
	// transaction deciding about one entity runs after the one before.
	// Parameters: consumer, order_key.
	OrderLockSQL(t Table) string

	// OrderBumpSQL sets the row's last_seq. Parameters: last_seq,
	// consumer, order_key.
	OrderBumpSQL(t Table) string

	// ParkSQL inserts a parked message, state 'P'. The middleware runs it
	// holding the entity's lock (OrderLockSQL) after ParkedSQL found no row
	// for the sequence; it must not fail on a duplicate all the same.
	// Parameters: consumer, order_key, seq, message_key, payload (bytes),
	// headers (text), event time, parked at.
	ParkSQL(t Table) string

	// SkipSQL inserts a tombstone, state 'S', for a sequence an operator
	// skipped, as ParkSQL does a parked message. Parameters: consumer,
	// order_key, seq, parked at.
	SkipSQL(t Table) string

	// ParkedSQL is a query yielding the row of one sequence, if any:
	// state (text 'P' or 'S'), message_key, payload, headers, event time.
	// Parameters: consumer, order_key, seq.
	ParkedSQL(t Table) string

	// UnparkSQL deletes the parked message of one sequence (state 'P').
	// Parameters: consumer, order_key, seq.
	UnparkSQL(t Table) string

	// WaitingSQL is a query yielding, for every entity of consumer with
	// parked messages (state 'P'), ordered by order_key: order_key,
	// last_seq (0 when the entity has no sequence row), the lowest parked
	// seq, how many are parked and the earliest parked at. Parameter:
	// consumer.
	WaitingSQL(t Table) string

	// UnclaimSQL deletes one claim of claim table t, for a parked message
	// that is dead-lettered. Parameters: consumer, message_key.
	UnclaimSQL(t Table) string

	// ParkedRowsSQL is a query yielding every parked message (state 'P')
	// of one entity in sequence order: seq, message_key, payload, headers,
	// event time, parked at. Parameters: consumer, order_key.
	ParkedRowsSQL(t Table) string
}

// OrderStatements builds the statements of an [Orderer] that are the same
// standard SQL in every dialect but for the placeholders and the locking
// clause: a dialect fills it in with its quoted table names and returns
// its methods' results from its own Orderer methods. The statements that
// differ (the tables, and the inserts that must not fail on a duplicate)
// each dialect writes itself.
type OrderStatements struct {
	// Seq, Parked and Claims are the quoted sequence, parking and claim
	// tables.
	Seq, Parked, Claims string
	// Placeholder returns the placeholder of parameter i, from 1: "$1" or
	// "?".
	Placeholder func(i int) string
	// ForUpdate is the clause that locks the rows a query reads, " FOR
	// UPDATE", or "" where a transaction's earlier write already holds
	// the lock (SQLite).
	ForUpdate string
}

func (s OrderStatements) p(i int) string { return s.Placeholder(i) }

// Lock is Orderer.OrderLockSQL.
func (s OrderStatements) Lock() string {
	return "SELECT last_seq FROM " + s.Seq + " WHERE consumer = " + s.p(1) + " AND order_key = " + s.p(2) + s.ForUpdate
}

// Bump is Orderer.OrderBumpSQL.
func (s OrderStatements) Bump() string {
	return "UPDATE " + s.Seq + " SET last_seq = " + s.p(1) + " WHERE consumer = " + s.p(2) + " AND order_key = " + s.p(3)
}

// ParkedOne is Orderer.ParkedSQL.
func (s OrderStatements) ParkedOne() string {
	return "SELECT state, message_key, payload, headers, event_time_us FROM " + s.Parked +
		" WHERE consumer = " + s.p(1) + " AND order_key = " + s.p(2) + " AND seq = " + s.p(3)
}

// Unpark is Orderer.UnparkSQL.
func (s OrderStatements) Unpark() string {
	return "DELETE FROM " + s.Parked + " WHERE consumer = " + s.p(1) + " AND order_key = " + s.p(2) + " AND seq = " + s.p(3) + " AND state = 'P'"
}

// Unclaim is Orderer.UnclaimSQL.
func (s OrderStatements) Unclaim() string {
	return "DELETE FROM " + s.Claims + " WHERE consumer = " + s.p(1) + " AND message_key = " + s.p(2)
}

// Waiting is Orderer.WaitingSQL.
func (s OrderStatements) Waiting() string {
	return "SELECT p.order_key, COALESCE(s.last_seq, 0), min(p.seq), count(*), min(p.parked_at_us)\nFROM " + s.Parked +
		" p LEFT JOIN " + s.Seq + " s ON s.consumer = p.consumer AND s.order_key = p.order_key\nWHERE p.consumer = " + s.p(1) +
		" AND p.state = 'P'\nGROUP BY p.order_key, s.last_seq ORDER BY p.order_key"
}

// ParkedRows is Orderer.ParkedRowsSQL.
func (s OrderStatements) ParkedRows() string {
	return "SELECT seq, message_key, payload, headers, event_time_us, parked_at_us FROM " + s.Parked +
		" WHERE consumer = " + s.p(1) + " AND order_key = " + s.p(2) + " AND state = 'P' ORDER BY seq"
}

// Park is the column list and values of a parked message, for the
// dialect's insert: "(consumer, …) VALUES (…, 'P', …)".
func (s OrderStatements) Park() string {
	return "(consumer, order_key, seq, state, message_key, payload, headers, event_time_us, parked_at_us)\nVALUES (" +
		s.p(1) + ", " + s.p(2) + ", " + s.p(3) + ", 'P', " + s.p(4) + ", " + s.p(5) + ", " + s.p(6) + ", " + s.p(7) + ", " + s.p(8) + ")"
}

// Skip is the column list and values of a tombstone, for the dialect's
// insert; empty is the dialect's literal of an empty payload.
func (s OrderStatements) Skip(empty string) string {
	return "(consumer, order_key, seq, state, message_key, payload, headers, event_time_us, parked_at_us)\nVALUES (" +
		s.p(1) + ", " + s.p(2) + ", " + s.p(3) + ", 'S', '', " + empty + ", '', 0, " + s.p(4) + ")"
}
