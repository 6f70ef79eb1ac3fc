package dialect

// BatchClaimer is implemented by dialects that can claim a whole batch of
// keys with one statement. The middleware checks for it with a type
// assertion; a dialect without it has batches claimed one statement per key,
// in the same transaction.
//
// The dialect owns how the keys are passed: BatchClaimSQL's statement takes
// the consumer as parameter 1 and BatchKeysArg's value as parameter 2, so
// the middleware never needs to know a driver's array encoding.
type BatchClaimer interface {
	// BatchClaimSQL returns a query that inserts the claims (consumer, key)
	// for parameter 1 and every key in parameter 2, in the order the keys
	// are given, skipping keys whose claim exists without failing, and
	// returns one row per claim it inserted, whose only column is the key.
	// The keys it is given are distinct.
	BatchClaimSQL(t Table) string

	// BatchKeysArg returns the value to pass as parameter 2 of
	// BatchClaimSQL's query for keys.
	BatchKeysArg(keys []string) any
}

// PartitionedBatchClaimer is implemented by dialects that can claim a whole
// batch of keys, each with its event day, with one statement on a claim
// table partitioned by day (see Partitioner). The middleware checks for it
// with a type assertion; without it, a batch in partitioned mode is claimed
// one ClaimAtSQL statement per key, in the same transaction.
type PartitionedBatchClaimer interface {
	BatchClaimer

	// PartitionedBatchClaimSQL returns a query that inserts the claims
	// (consumer, key, day) for parameter 1, every key in parameter 2 and
	// the day at the same position in parameter 3, in the order the keys
	// are given, skipping claims that exist without failing, and returns
	// one row per claim it inserted, whose only column is the key. Both
	// arrays are passed as BatchKeysArg values; the days are dates written
	// YYYY-MM-DD. The keys are distinct. A day without a partition fails the
	// whole statement with an error IsNoPartition recognises.
	PartitionedBatchClaimSQL(t Table) string
}
