package postgres

import (
	"fmt"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
)

var (
	_ dialect.BatchClaimer            = (*Dialect)(nil)
	_ dialect.PartitionedBatchClaimer = (*Dialect)(nil)
)

// BatchClaimSQL returns one INSERT … SELECT over unnest of a text array:
// the claims are inserted in the array's order (WITH ORDINALITY … ORDER BY),
// existing ones are skipped by ON CONFLICT DO NOTHING, and RETURNING yields
// the keys that were new. Given keys in a stable order, two overlapping
// batches take their claim locks in the same order and cannot deadlock each
// other.
func (*Dialect) BatchClaimSQL(t dialect.Table) string {
	return fmt.Sprintf("INSERT INTO %s (consumer, message_key) "+
		"SELECT $1, k FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i "+
		"ON CONFLICT DO NOTHING RETURNING message_key", quote(t))
}

// PartitionedBatchClaimSQL is BatchClaimSQL for a claim table partitioned
// by event day: unnest zips the keys with their days, so a batch spanning
// several days is still one statement, and each row goes to its day's
// partition. A day without a partition fails the statement with 23514.
func (*Dialect) PartitionedBatchClaimSQL(t dialect.Table) string {
	return fmt.Sprintf("INSERT INTO %s (consumer, message_key, %s) "+
		"SELECT $1, k, d::date FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS u(k, d, i) ORDER BY i "+
		"ON CONFLICT DO NOTHING RETURNING message_key", quote(t), DayColumn)
}

// BatchKeysArg returns keys as a Postgres text array parameter. The value
// is a driver.Valuer (lib/pq's array encoding), which lib/pq and pgx's
// stdlib driver both accept.
func (*Dialect) BatchKeysArg(keys []string) any { return pq.StringArray(keys) }
