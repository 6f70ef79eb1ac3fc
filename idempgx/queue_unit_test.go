package idempgx

import "testing"

func TestTxCommand(t *testing.T) {
	for sql, want := range map[string]string{
		"COMMIT":                          "COMMIT",
		"  commit;":                       "COMMIT",
		"end":                             "END",
		"Rollback to savepoint x":         "ROLLBACK",
		"abort":                           "ABORT",
		"begin":                           "BEGIN",
		"start transaction":               "START",
		"savepoint a":                     "SAVEPOINT",
		"release savepoint a":             "RELEASE",
		"-- note\n/* more */ COMMIT":      "COMMIT",
		"/* unterminated COMMIT":          "",
		"prepare transaction 'g1'":        "PREPARE TRANSACTION",
		"PREPARE q AS SELECT 1":           "",
		"INSERT INTO t VALUES (1)":        "",
		"UPDATE commits SET n = 1":        "",
		"(SELECT 1)":                      "",
		"":                                "",
		"with x as (select 1) select * x": "",
	} {
		if got := txCommand(sql); got != want {
			t.Errorf("txCommand(%q) = %q, want %q", sql, got, want)
		}
	}
}
