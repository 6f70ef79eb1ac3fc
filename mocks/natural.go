package mocks

// ExpectNatural expects the start of a ProcessNatural delivery, which takes
// no claim: BEGIN and, with WithStrictGuard, the transaction id query. The
// handler runs next: script its conflict-free insert on the natural key —
// rows affected 1 when the message is new (Applied), 0 when it is not
// (Duplicate) — then ExpectCommit, which ProcessNatural sends either way,
// or ExpectRollback if the handler fails.
func (m *Mock) ExpectNatural() {
	m.Sqlmock.ExpectBegin()
	m.expectFirstTxID()
}
