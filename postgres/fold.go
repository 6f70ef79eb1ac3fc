package postgres

import "github.com/txclaim/idempotent/dialect"

var _ dialect.ClaimFolder = (*Dialect)(nil)

// FoldClaimSQL returns one statement of two data-modifying common table
// expressions, each with RETURNING 1, and a SELECT that counts the rows of
// each: companion's first, then the claim's. Both always run to completion,
// whatever the SELECT reads; the SELECT evaluates companion's count first,
// so companion is in practice run first, as it would be written first in
// the transaction.
func (*Dialect) FoldClaimSQL(claim, companion string) string {
	if claim == "" || companion == "" {
		return ""
	}
	return "WITH companion AS (" + companion + " RETURNING 1), claim AS (" + claim + " RETURNING 1) " +
		"SELECT (SELECT count(*) FROM companion), (SELECT count(*) FROM claim)"
}
