package postgres

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

var _ dialect.TxFencer = (*Dialect)(nil)

// FenceSetting is the custom setting a coalesced group's transaction is
// marked with (dialect.TxFencer): set with set_config(…, true), it lasts
// until the transaction commits or rolls back, and reads as "" after.
const FenceSetting = "idempotent.tx"

// fenceZero is an integer expression that is 1 in the transaction marked
// with token, and 0 anywhere else, where dividing by it fails with SQLSTATE
// 22012. current_setting is stable, not immutable, so the planner never
// evaluates the division ahead of time.
func fenceZero(token string) string {
	return "(CASE WHEN current_setting('" + FenceSetting + "', true) = " + token + "::text THEN 1 ELSE 0 END)"
}

// TxFenceSQL returns SELECT set_config('idempotent.tx', $1, true), which
// marks the transaction with the token $1 until it ends, and with a
// positive lockWait also set_config('lock_timeout', …, true), which is SET
// LOCAL lock_timeout: one statement either way.
func (*Dialect) TxFenceSQL(lockWait time.Duration) string {
	q := "SELECT set_config('" + FenceSetting + "', $1::text, true)"
	if lockWait > 0 {
		ms := min((lockWait+time.Millisecond-1)/time.Millisecond, math.MaxInt32)
		q += fmt.Sprintf(", set_config('lock_timeout', '%d', true)", int64(ms))
	}
	return q
}

// TxFencedClaimSQL returns the claim as INSERT … SELECT whose WHERE clause
// divides by fenceZero: outside the transaction marked with the token (the
// last parameter) it fails with SQLSTATE 22012 before inserting anything.
// With horizon the horizon's condition follows, as HorizonClaimSQL has it;
// Postgres may skip the fence when that condition is false, and the claim
// then inserts nothing, as it must for a message beyond the horizon.
func (d *Dialect) TxFencedClaimSQL(t dialect.Table, partitioned, horizon bool) string {
	cols, vals, n := "consumer, message_key", "$1::text, $2::text", 3
	if partitioned {
		cols, vals, n = "consumer, message_key, event_day", "$1::text, $2::text, $3::date", 4
	}
	where := fmt.Sprintf("1 / %s = 1", fenceZero(fmt.Sprintf("$%d", n)))
	if horizon {
		where = fmt.Sprintf("1 / %[1]s = 1 AND (%[2]s::timestamptz IS NULL OR NOT EXISTS (SELECT FROM %[3]s WHERE consumer IN ('', $1::text) AND forgotten_before > %[2]s::timestamptz))",
			fenceZero(fmt.Sprintf("$%d", n+1)), fmt.Sprintf("$%d", n), d.horizon(t))
	}
	return fmt.Sprintf("INSERT INTO %s (%s) SELECT %s\nWHERE %s\nON CONFLICT DO NOTHING", quote(t), cols, vals, where)
}

// TxFenceCheckSQL returns SELECT 1 / fenceZero($1): 1 in the marked
// transaction, SQLSTATE 22012 anywhere else.
func (*Dialect) TxFenceCheckSQL() string { return "SELECT 1 / " + fenceZero("$1") }

// TxFenceBroken reports SQLSTATE 22012 (the fence's division), 25P02 (the
// transaction is aborted: a statement before failed) and 25P01 (no
// transaction is open).
func (*Dialect) TxFenceBroken(err error) bool {
	var se interface{ SQLState() string }
	if !errors.As(err, &se) {
		return false
	}
	switch se.SQLState() {
	case "22012", "25P02", "25P01":
		return true
	}
	return false
}
