package idempotent

import "testing"

func TestEndsTransaction(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  bool
	}{
		{"COMMIT", true},
		{"commit", true},
		{"  \n\tCommit;", true},
		{"-- done\nCOMMIT", true},
		{"/* done */ ROLLBACK", true},
		{"ROLLBACK WORK", true},
		{"ROLLBACK TRANSACTION", true},
		{"ROLLBACK TO SAVEPOINT s1", false},
		{"rollback to s1", false},
		{"ROLLBACK TRANSACTION TO SAVEPOINT s1", false},
		{"BEGIN", true},
		{"START TRANSACTION", true},
		{"END", true},
		{"ABORT", true},
		{"COMMIT; BEGIN", true},
		{"PREPARE TRANSACTION 'x'", true},
		{"PREPARE stmt AS SELECT 1", false},
		{"SAVEPOINT s1", false},
		{"RELEASE SAVEPOINT s1", false},
		{"SELECT 'COMMIT'", false},
		{"UPDATE balances SET points = points + 1", false},
		{"INSERT INTO committed_orders VALUES (1)", false},
		{"COMMITTED", false},
		{"", false},
		{"/* unterminated", false},
		{"-- only a comment", false},
	} {
		if got := endsTransaction(tc.query); got != tc.want {
			t.Errorf("endsTransaction(%q) = %v, want %v", tc.query, got, tc.want)
		}
	}
}

func TestEndsTransactionAllocatesNothing(t *testing.T) {
	for _, q := range []string{"update balances set points = points + 1", "INSERT INTO t VALUES (1)", "rollback to savepoint s"} {
		if n := testing.AllocsPerRun(100, func() { endsTransaction(q) }); n != 0 {
			t.Errorf("endsTransaction(%q) allocates %v times per call, want 0", q, n)
		}
	}
}
