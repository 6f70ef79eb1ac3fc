package postgres

import (
	"fmt"
	"strings"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.Upserter = (*Dialect)(nil)

// VersionedUpsertSQL returns
//
//	INSERT INTO t AS target (key…, version, columns…) VALUES ($1, …)
//	ON CONFLICT (key…) DO UPDATE SET version = EXCLUDED.version, column = EXCLUDED.column, …
//	WHERE target.version < EXCLUDED.version
//
// The key columns must carry a unique index or constraint.
func (*Dialect) VersionedUpsertSQL(t dialect.Table, key []string, version string, columns []string) string {
	all := make([]string, 0, len(key)+1+len(columns))
	all = append(all, key...)
	all = append(all, version)
	all = append(all, columns...)
	var cols, params, set []string
	for i, c := range all {
		cols = append(cols, pq.QuoteIdentifier(c))
		params = append(params, fmt.Sprintf("$%d", i+1))
	}
	for _, c := range append([]string{version}, columns...) {
		set = append(set, fmt.Sprintf("%[1]s = EXCLUDED.%[1]s", pq.QuoteIdentifier(c)))
	}
	keys := make([]string, len(key))
	for i, k := range key {
		keys[i] = pq.QuoteIdentifier(k)
	}
	v := pq.QuoteIdentifier(version)
	return fmt.Sprintf("INSERT INTO %s AS target (%s) VALUES (%s) ON CONFLICT (%s) DO UPDATE SET %s WHERE target.%s < EXCLUDED.%s",
		quote(t), strings.Join(cols, ", "), strings.Join(params, ", "), strings.Join(keys, ", "), strings.Join(set, ", "), v, v)
}
