package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
)

// TestClassifyTable checks the mapping of error numbers. The conformance
// suite (tests/conformance_test.go) feeds the dialect real errors from
// MariaDB: deadlock, lock wait timeout, missing table, killed session. This
// table covers the numbers a test cannot provoke on demand (a server
// shutting down, MySQL-only codes).
func TestClassifyTable(t *testing.T) {
	d := New()
	for _, tc := range []struct {
		err  error
		kind dialect.Kind
		code string
	}{
		{&mysql.MySQLError{Number: 1213}, dialect.KindSerialization, "1213"},
		{&mysql.MySQLError{Number: 1020}, dialect.KindSerialization, "1020"},
		{&mysql.MySQLError{Number: 1205}, dialect.KindLockTimeout, "1205"},
		{&mysql.MySQLError{Number: 1146}, dialect.KindUndefinedTable, "1146"},
		{&mysql.MySQLError{Number: 1053}, dialect.KindConnection, "1053"},
		{&mysql.MySQLError{Number: 1927}, dialect.KindConnection, "1927"},
		{&mysql.MySQLError{Number: 4031}, dialect.KindConnection, "4031"},
		{&mysql.MySQLError{Number: 2006}, dialect.KindConnection, "2006"},
		{&mysql.MySQLError{Number: 2013}, dialect.KindConnection, "2013"},
		// Galera: a certification failure, as MariaDB 10.11 Cluster reports it
		// at COMMIT (tests/galera_test.go); a node outside the primary component.
		{&mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'}, Message: "Deadlock found when trying to get lock; try restarting transaction"}, dialect.KindSerialization, "1213"},
		{&mysql.MySQLError{Number: 1047, SQLState: [5]byte{'0', '8', 'S', '0', '1'}, Message: "WSREP has not yet prepared node for application use"}, dialect.KindConnection, "1047"},
		// A COMMIT whose write set could not be replicated: certification
		// failed, a brute-force abort, the primary component lost are
		// retried; a write set over wsrep_max_ws_size and a storage
		// engine's error during COMMIT are not.
		{&mysql.MySQLError{Number: 1180, Message: "Got error 3 \"No such process\" during COMMIT"}, dialect.KindSerialization, "1180"},
		{&mysql.MySQLError{Number: 1180, Message: "Got error 4 \"Interrupted system call\" during COMMIT"}, dialect.KindSerialization, "1180"},
		{&mysql.MySQLError{Number: 1180, Message: "Got error 6 \"No such device or address\" during COMMIT"}, dialect.KindSerialization, "1180"},
		{&mysql.MySQLError{Number: 1180, Message: "Got error 5 \"Input/output error\" during COMMIT"}, dialect.KindOther, "1180"},
		{&mysql.MySQLError{Number: 1180, Message: "Got error 28 \"No space left on device\" during COMMIT"}, dialect.KindOther, "1180"},
		{&mysql.MySQLError{Number: 1180, Message: "something else"}, dialect.KindOther, "1180"},
		{&mysql.MySQLError{Number: 1062}, dialect.KindOther, "1062"},
		{&mysql.MySQLError{Number: 1406}, dialect.KindOther, "1406"},
		{mysql.ErrInvalidConn, dialect.KindConnection, ""},
		{driver.ErrBadConn, dialect.KindConnection, ""},
		{errors.New("something else"), dialect.KindOther, ""},
	} {
		for _, err := range []error{tc.err, fmt.Errorf("wrapped: %w", tc.err)} {
			c := d.Classify(err)
			if c.Kind != tc.kind || c.Code != tc.code {
				t.Errorf("Classify(%v) = %+v, want %v %q", err, c, tc.kind, tc.code)
			}
		}
	}
	if c := d.Classify(nil); c != (dialect.Class{}) {
		t.Errorf("Classify(nil) = %+v", c)
	}
}

// fakeServer answers CheckServer's queries from a map, by query prefix.
func fakeServer(answers map[string]string, errs map[string]error) dialect.QueryFunc {
	return func(_ context.Context, query string, _ ...any) (string, error) {
		for prefix, err := range errs {
			if strings.HasPrefix(query, prefix) {
				return "", err
			}
		}
		for prefix, a := range answers {
			if strings.HasPrefix(query, prefix) {
				return a, nil
			}
		}
		return "", sql.ErrNoRows
	}
}

func TestCheckServer(t *testing.T) {
	d := New()
	ctx := context.Background()
	tbl := dialect.Table{Name: "processed_messages"}
	good := map[string]string{
		versionSQL:  "10.11.6-MariaDB",
		databaseSQL: "shop",
		innodbSQL:   "DEFAULT",
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = v
		return m
	}
	if err := d.CheckServer(ctx, tbl, fakeServer(good, nil)); err != nil {
		t.Errorf("MariaDB, no table yet: %v", err)
	}
	if err := d.CheckServer(ctx, tbl, fakeServer(with(tableEngineSQL, "InnoDB"), nil)); err != nil {
		t.Errorf("MariaDB, InnoDB table: %v", err)
	}
	if err := d.CheckServer(ctx, tbl, fakeServer(with(versionSQL, "8.0.36"), nil)); err != nil {
		t.Errorf("MySQL 8: %v", err)
	}
	for name, tc := range map[string]struct {
		q        dialect.QueryFunc
		wrongDB  bool
		contains string
	}{
		"postgres":      {fakeServer(with(versionSQL, "PostgreSQL 15.4 on x86_64"), nil), true, "PostgreSQL 15.4"},
		"no version()":  {fakeServer(good, map[string]error{versionSQL: errors.New("no such function: VERSION")}), true, "no such function"},
		"no database":   {fakeServer(with(databaseSQL, ""), nil), false, "no database selected"},
		"no InnoDB":     {fakeServer(with(innodbSQL, "NO"), nil), false, "InnoDB"},
		"InnoDB absent": {fakeServer(with(innodbSQL, ""), nil), false, "InnoDB"},
		"MyISAM table":  {fakeServer(with(tableEngineSQL, "MyISAM"), nil), false, "MyISAM"},
	} {
		err := d.CheckServer(ctx, tbl, tc.q)
		if err == nil || !strings.Contains(err.Error(), tc.contains) || errors.Is(err, dialect.ErrWrongDatabase) != tc.wrongDB {
			t.Errorf("%s: %v; want an error containing %q, ErrWrongDatabase %v", name, err, tc.contains, tc.wrongDB)
		}
	}
	// A lost connection is not a wrong database: it is returned as it is,
	// for the middleware to retry.
	err := d.CheckServer(ctx, tbl, fakeServer(good, map[string]error{versionSQL: mysql.ErrInvalidConn}))
	if !errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, dialect.ErrWrongDatabase) {
		t.Errorf("lost connection: %v", err)
	}
	// A qualified table needs no default database.
	if err := d.CheckServer(ctx, dialect.Table{Schema: "shop", Name: "t"}, fakeServer(with(databaseSQL, ""), nil)); err != nil {
		t.Errorf("qualified table without a default database: %v", err)
	}
}
