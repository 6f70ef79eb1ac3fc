package dialect

// Orderer is implemented by dialects that keep messages of one entity in
// the producer's order (idempotent.WithOrdering). It is optional: a
// Middleware created WithOrdering on a dialect without it is refused by
// idempotent.New with an error naming the dialect. A dialect implements it
// by embedding [OrderSQL] and writing only OrderSchemaSQL and
// MaxOrderKeyBytes.
//
// Ordering needs two tables beside claim table t, both in t's schema:
//
//   - the sequence table, one row per (consumer, order_key) with last_seq,
//     the last sequence number applied (or skipped) for that entity, and
//     parked_max, at least the highest sequence ever parked for it (a
//     hint: while last_seq is at or above it, nothing can be parked, and
//     the middleware does not look);
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

	// OrderAdvanceSQL is the one statement that decides an ordered
	// message, or "" where the dialect has no INSERT … ON CONFLICT DO
	// UPDATE … WHERE … RETURNING (the middleware then runs OrderRowSQL,
	// OrderLockSQL and OrderBumpSQL or OrderMarkSQL instead). For the
	// entity's row it:
	//
	//   - inserts it when missing, with last_seq = 1 and parked_max = 0
	//     for seq 1, else last_seq = 0 and parked_max = seq, and yields it;
	//   - otherwise locks it until the transaction ends, and, when
	//     last_seq < seq, sets last_seq to seq if last_seq is seq - 1, or
	//     else raises parked_max to seq, and yields the row as updated;
	//   - when last_seq >= seq, changes nothing and yields no row (the
	//     row stays locked).
	//
	// It yields last_seq, parked_max. Parameters: consumer, order_key, seq.
	OrderAdvanceSQL(t Table) string

	// OrderClaimAdvanceSQL is, where the dialect can run an INSERT in a
	// WITH clause (Postgres), the claim of a message (the dialect's
	// ClaimSQL) and OrderAdvanceSQL in one statement: the advance runs
	// only when the claim inserted, and after it, so a message's locks
	// are taken in the same order as by the two statements. It yields
	// one row: how many claims it inserted (0 or 1), then last_seq and
	// parked_max as OrderAdvanceSQL yields them, both NULL when it
	// yielded no row or did not run. Parameters: consumer, message_key,
	// order_key, seq. "" elsewhere.
	OrderClaimAdvanceSQL(t Table) string

	// OrderRowSQL inserts the sequence row (consumer, order_key) with
	// last_seq and parked_max 0 unless it exists, and never fails on a
	// duplicate. Parameters: consumer, order_key.
	OrderRowSQL(t Table) string

	// OrderLockSQL is a query yielding the row's last_seq and parked_max
	// (integers) and locking the row until the transaction ends, so that
	// every transaction deciding about one entity runs after the one
	// before. Parameters: consumer, order_key.
	OrderLockSQL(t Table) string

	// OrderBumpSQL sets the row's last_seq. Parameters: last_seq,
	// consumer, order_key.
	OrderBumpSQL(t Table) string

	// OrderMarkSQL raises the row's parked_max to seq if it is lower, and
	// by one otherwise: it changes the row every time, so that a park
	// writes the entity's row as every apply does. On a multi-primary
	// cluster (Galera), where the lock of OrderLockSQL is only the node's
	// own, the two then certify against each other: of a park and an
	// apply of the entity run at once on two nodes, one fails and is
	// retried, and the retry sees the other (a park that wrote only the
	// parking table could commit beside an apply that did not see it, and
	// stay parked behind a sequence nothing releases). Parameters: seq,
	// seq, consumer, order_key.
	OrderMarkSQL(t Table) string

	// ParkSQL inserts a parked message, state 'P', holding the entity's
	// lock. It must not fail on a duplicate; where OrderAdvanceSQL is not
	// "", it reports 1 affected row when it inserted and 0 for a
	// duplicate. Parameters: consumer, order_key, seq, message_key,
	// payload (bytes), headers (text), event time, parked at.
	ParkSQL(t Table) string

	// SkipSQL inserts a tombstone, state 'S', for a sequence an operator
	// skipped, as ParkSQL does a parked message. Parameters: consumer,
	// order_key, seq, parked at.
	SkipSQL(t Table) string

	// ParkedSQL is a query yielding the row of one sequence, if any:
	// state (text 'P' or 'S'), message_key, payload, headers, event time.
	// Parameters: consumer, order_key, seq.
	ParkedSQL(t Table) string

	// ParkedLockSQL is ParkedSQL as a locking read, which sees the row's
	// latest committed version whatever the transaction's snapshot: where
	// OrderAdvanceSQL is "" (MySQL), a coalesced group reads the parking
	// table with it, since its snapshot (repeatable read) may date from a
	// read made for an earlier member, before it locked this entity's
	// row. Where ForUpdate is "", it is ParkedSQL. Parameters: consumer,
	// order_key, seq.
	ParkedLockSQL(t Table) string

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

// OrderSyntax is what the statements of [OrderSQL] take from a dialect.
// Its methods are called on the zero value of the dialect's type.
type OrderSyntax interface {
	// OrderTables returns t's sequence table and parking table.
	OrderTables(t Table) (seq, parked Table)
	// Quote quotes a table name, with its schema.
	Quote(t Table) string
	// Placeholder returns the placeholder of parameter i, from 1: "$1",
	// "?1", or "?" where the dialect has no numbered placeholders (the
	// middleware passes a parameter a statement uses twice twice, and an
	// Upsert dialect must number them).
	Placeholder(i int) string
	// ForUpdate is the clause that locks the rows a query reads, " FOR
	// UPDATE", or "" where a transaction's earlier write already holds
	// the lock (SQLite).
	ForUpdate() string
	// OnConflict is the clause that makes an INSERT into either table
	// insert nothing, and not fail, when the row exists: " ON CONFLICT DO
	// NOTHING" or " ON DUPLICATE KEY UPDATE consumer = consumer".
	OnConflict() string
	// EmptyBytes is the literal of an empty payload: "''::bytea", "X''".
	EmptyBytes() string
	// Upsert reports whether the dialect has INSERT … ON CONFLICT (…) DO
	// UPDATE SET … WHERE … RETURNING, with numbered placeholders, and
	// greatest is its two-argument maximum ("GREATEST", "max"): only then
	// is OrderAdvanceSQL not "".
	Upsert() (ok bool, greatest string)
	// ClaimSQL is the dialect's claim of a message (Dialect.ClaimSQL)
	// where it may run in a WITH clause with RETURNING, "" elsewhere.
	ClaimSQL(t Table) string
}

// OrderSQL implements every method of [Orderer] but OrderSchemaSQL and
// MaxOrderKeyBytes from S's syntax, in standard SQL: a dialect embeds
// OrderSQL[its syntax type] in its Dialect type. The zero value is ready
// to use.
type OrderSQL[S OrderSyntax] struct{}

func (OrderSQL[S]) syn() S { var s S; return s }

func (o OrderSQL[S]) p(i int) string { return o.syn().Placeholder(i) }

func (o OrderSQL[S]) tables(t Table) (seq, parked string) {
	s := o.syn()
	sq, pk := s.OrderTables(t)
	return s.Quote(sq), s.Quote(pk)
}

func (o OrderSQL[S]) entity() string {
	return " WHERE consumer = " + o.p(1) + " AND order_key = " + o.p(2)
}

// OrderTables returns S's tables.
func (o OrderSQL[S]) OrderTables(t Table) (seq, parked Table) { return o.syn().OrderTables(t) }

// OrderAdvanceSQL is, where S has an upsert with RETURNING (see
// [Orderer]):
//
//	INSERT INTO seq AS s (consumer, order_key, last_seq, parked_max)
//	VALUES ($1, $2, CASE WHEN $3 = 1 THEN 1 ELSE 0 END, CASE WHEN $3 = 1 THEN 0 ELSE $3 END)
//	-- ($3 cast to BIGINT everywhere)
//	ON CONFLICT (consumer, order_key) DO UPDATE SET
//	  last_seq   = CASE WHEN s.last_seq = $3 - 1 THEN $3 ELSE s.last_seq END,
//	  parked_max = CASE WHEN s.last_seq = $3 - 1 THEN s.parked_max ELSE GREATEST(s.parked_max, $3) END
//	WHERE s.last_seq < $3
//	RETURNING last_seq, parked_max
func (o OrderSQL[S]) OrderAdvanceSQL(t Table) string {
	return o.advance(t, 1, 2, 3, "")
}

// advance is OrderAdvanceSQL with the parameters of consumer, order_key
// and seq numbered c, k and n; with cte, it inserts a missing row only
// when the WITH clause of that name yielded a row.
func (o OrderSQL[S]) advance(t Table, c, k, q int, cte string) string {
	ok, greatest := o.syn().Upsert()
	if !ok {
		return ""
	}
	seq, _ := o.tables(t)
	// Cast: an untyped parameter in $3 - 1 would be taken for an integer.
	n := "CAST(" + o.p(q) + " AS BIGINT)"
	row := o.p(c) + ", " + o.p(k) + ", CASE WHEN " + n + " = 1 THEN 1 ELSE 0 END, CASE WHEN " + n + " = 1 THEN 0 ELSE " + n + " END"
	source := "VALUES (" + row + ")"
	if cte != "" {
		source = "SELECT " + row + " WHERE EXISTS (SELECT 1 FROM " + cte + ")"
	}
	return "INSERT INTO " + seq + " AS s (consumer, order_key, last_seq, parked_max)\n" + source + "\n" +
		"ON CONFLICT (consumer, order_key) DO UPDATE SET\n" +
		"\tlast_seq = CASE WHEN s.last_seq = " + n + " - 1 THEN " + n + " ELSE s.last_seq END,\n" +
		"\tparked_max = CASE WHEN s.last_seq = " + n + " - 1 THEN s.parked_max ELSE " + greatest + "(s.parked_max, " + n + ") END\n" +
		"WHERE s.last_seq < " + n + "\nRETURNING last_seq, parked_max"
}

// OrderClaimAdvanceSQL is, where S's ClaimSQL is not "":
//
//	WITH c AS (claim RETURNING 1),
//	a AS (OrderAdvanceSQL, inserting only WHERE EXISTS (SELECT 1 FROM c))
//	SELECT (SELECT count(*) FROM c), a.last_seq, a.parked_max
//	FROM (SELECT 1) AS one LEFT JOIN a ON true
//
// The advance reads the claim's RETURNING, so it runs after the claim
// inserted, and not at all when the claim found a duplicate.
func (o OrderSQL[S]) OrderClaimAdvanceSQL(t Table) string {
	claim := o.syn().ClaimSQL(t)
	if claim == "" {
		return ""
	}
	adv := o.advance(t, 1, 3, 4, "c")
	if adv == "" {
		return ""
	}
	return "WITH c AS (" + claim + " RETURNING 1),\na AS (" + adv + ")\n" +
		"SELECT (SELECT count(*) FROM c), a.last_seq, a.parked_max FROM (SELECT 1) AS one LEFT JOIN a ON true"
}

// OrderRowSQL inserts the row with last_seq and parked_max 0, S's
// OnConflict.
func (o OrderSQL[S]) OrderRowSQL(t Table) string {
	seq, _ := o.tables(t)
	return "INSERT INTO " + seq + " (consumer, order_key, last_seq, parked_max) VALUES (" + o.p(1) + ", " + o.p(2) + ", 0, 0)" + o.syn().OnConflict()
}

// OrderLockSQL reads last_seq and parked_max with S's ForUpdate. Without
// one (SQLite), the middleware reads the row only after a write of the
// same transaction (the claim, or OrderRowSQL), so the transaction already
// holds the database's write lock.
func (o OrderSQL[S]) OrderLockSQL(t Table) string {
	seq, _ := o.tables(t)
	return "SELECT last_seq, parked_max FROM " + seq + o.entity() + o.syn().ForUpdate()
}

// OrderBumpSQL sets last_seq.
func (o OrderSQL[S]) OrderBumpSQL(t Table) string {
	seq, _ := o.tables(t)
	return "UPDATE " + seq + " SET last_seq = " + o.p(1) + " WHERE consumer = " + o.p(2) + " AND order_key = " + o.p(3)
}

// OrderMarkSQL raises parked_max to seq, or by one when it is there
// already: a write every time.
func (o OrderSQL[S]) OrderMarkSQL(t Table) string {
	seq, _ := o.tables(t)
	return "UPDATE " + seq + " SET parked_max = CASE WHEN parked_max < " + o.p(1) + " THEN " + o.p(2) + " ELSE parked_max + 1 END WHERE consumer = " + o.p(3) + " AND order_key = " + o.p(4)
}

const orderColumns = "(consumer, order_key, seq, state, message_key, payload, headers, event_time_us, parked_at_us)"

// ParkSQL inserts a parked message, S's OnConflict.
func (o OrderSQL[S]) ParkSQL(t Table) string {
	_, parked := o.tables(t)
	vals := ""
	for i := 4; i <= 8; i++ {
		vals += ", " + o.p(i)
	}
	return "INSERT INTO " + parked + " " + orderColumns + "\nVALUES (" + o.p(1) + ", " + o.p(2) + ", " + o.p(3) + ", 'P'" + vals + ")" + o.syn().OnConflict()
}

// SkipSQL inserts a tombstone, S's OnConflict.
func (o OrderSQL[S]) SkipSQL(t Table) string {
	_, parked := o.tables(t)
	return "INSERT INTO " + parked + " " + orderColumns + "\nVALUES (" + o.p(1) + ", " + o.p(2) + ", " + o.p(3) + ", 'S', '', " +
		o.syn().EmptyBytes() + ", '', 0, " + o.p(4) + ")" + o.syn().OnConflict()
}

// ParkedSQL reads the row of one sequence.
func (o OrderSQL[S]) ParkedSQL(t Table) string {
	_, parked := o.tables(t)
	return "SELECT state, message_key, payload, headers, event_time_us FROM " + parked + o.entity() + " AND seq = " + o.p(3)
}

// ParkedLockSQL is ParkedSQL with S's ForUpdate.
func (o OrderSQL[S]) ParkedLockSQL(t Table) string { return o.ParkedSQL(t) + o.syn().ForUpdate() }

// UnparkSQL deletes the parked message of one sequence.
func (o OrderSQL[S]) UnparkSQL(t Table) string {
	_, parked := o.tables(t)
	return "DELETE FROM " + parked + o.entity() + " AND seq = " + o.p(3) + " AND state = 'P'"
}

// UnclaimSQL deletes one claim.
func (o OrderSQL[S]) UnclaimSQL(t Table) string {
	return "DELETE FROM " + o.syn().Quote(t) + " WHERE consumer = " + o.p(1) + " AND message_key = " + o.p(2)
}

// WaitingSQL lists the entities with parked messages.
func (o OrderSQL[S]) WaitingSQL(t Table) string {
	seq, parked := o.tables(t)
	return "SELECT p.order_key, COALESCE(s.last_seq, 0), min(p.seq), count(*), min(p.parked_at_us)\nFROM " + parked +
		" p LEFT JOIN " + seq + " s ON s.consumer = p.consumer AND s.order_key = p.order_key\nWHERE p.consumer = " + o.p(1) +
		" AND p.state = 'P'\nGROUP BY p.order_key, s.last_seq ORDER BY p.order_key"
}

// ParkedRowsSQL lists one entity's parked messages in sequence order.
func (o OrderSQL[S]) ParkedRowsSQL(t Table) string {
	_, parked := o.tables(t)
	return "SELECT seq, message_key, payload, headers, event_time_us, parked_at_us FROM " + parked + o.entity() + " AND state = 'P' ORDER BY seq"
}
