package dialect

// Upserter is implemented by dialects that can build a version-guarded
// upsert: insert a row, or update the existing row with the same key only if
// the new version is greater. It is optional; idempotent.NewVersionedUpsert
// reports an error for a dialect without it.
type Upserter interface {
	// VersionedUpsertSQL returns a statement taking, as parameters in this
	// order, the key columns, the version column and the other columns. It
	// affects one row when it inserted or updated, and none when the stored
	// version is equal or greater (a stale or repeated message). All names
	// have passed CheckIdentifier; the dialect quotes them.
	VersionedUpsertSQL(t Table, key []string, version string, columns []string) string
}
