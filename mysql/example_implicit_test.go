package mysql_test

import (
	"database/sql"
	"fmt"

	"github.com/txclaim/idempotent/mysql"
)

// The guard asks the dialect about every statement a handler sends through
// the claim's transaction, and refuses those MySQL would commit implicitly.
func ExampleDialect_CommitsImplicitly() {
	d := mysql.New()
	for _, q := range []string{
		"UPDATE balances SET points = points + 50 WHERE customer_id = 7",
		"CREATE TABLE audit (id INT)",
		"CREATE TEMPORARY TABLE scratch (id INT)",
		"/* nightly */ TRUNCATE TABLE report",
		"LOCK TABLES balances WRITE",
		"SET autocommit = 1",
	} {
		fmt.Printf("%-5v %s\n", d.CommitsImplicitly(q), q)
	}
	// Output:
	// false UPDATE balances SET points = points + 50 WHERE customer_id = 7
	// true  CREATE TABLE audit (id INT)
	// false CREATE TEMPORARY TABLE scratch (id INT)
	// true  /* nightly */ TRUNCATE TABLE report
	// true  LOCK TABLES balances WRITE
	// true  SET autocommit = 1
}

// idempotent.New calls CheckTxOptions with the options of WithTxOptions.
func ExampleDialect_CheckTxOptions() {
	d := mysql.New()
	fmt.Println(d.CheckTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}))
	fmt.Println(d.CheckTxOptions(sql.TxOptions{Isolation: sql.LevelSnapshot}) != nil)
	// Output:
	// <nil>
	// true
}
