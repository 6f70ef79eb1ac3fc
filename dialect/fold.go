package dialect

// ClaimFolder is an optional interface of a [Dialect] that can run the claim
// and another data-modifying statement of the same transaction — a
// companion, such as an adapter's offset advance — as one statement, so
// that a transaction that writes both pays one round trip to the database
// rather than two. Postgres does it with data-modifying common table
// expressions. A dialect without it has the two run one after the other.
type ClaimFolder interface {
	// FoldClaimSQL returns one query that runs the claim and companion and
	// yields exactly one row of two integer columns: the number of rows
	// companion affected, then the number of rows the claim inserted (1
	// when the claim is new, 0 when it existed). claim is the dialect's own
	// ClaimSQL or ClaimAtSQL statement, whose parameters come first;
	// companion is a single INSERT, UPDATE or DELETE without a RETURNING
	// clause, whose parameters are numbered after claim's. Which of the two
	// takes its row locks first is not specified. It returns "" when it
	// cannot fold these two statements.
	FoldClaimSQL(claim, companion string) string
}

// HorizonClaimFolder is an optional interface of a [Dialect] that is both a
// [ClaimFolder] and a [HorizonClaimer]: it folds the horizon's read into
// the folded claim too, so a transaction that claims, advances a companion
// and is fenced by the retention horizon still pays one round trip.
type HorizonClaimFolder interface {
	// FoldHorizonClaimSQL returns one query that runs companion and the
	// claim with the horizon folded in, and yields exactly one row of three
	// columns: the rows companion affected, the claims inserted (0 or 1) and
	// the horizon read (nullable microseconds since the Unix epoch). Its
	// parameters are those of HorizonClaimSQL — consumer, key, the event day
	// when partitioned, the fence value — then companion's, numbered after
	// them. Companion runs whether or not the horizon lets the claim in; the
	// caller rolls back a refused claim's transaction. It returns "" when it
	// cannot fold companion.
	FoldHorizonClaimSQL(t Table, partitioned bool, companion string) string
}
