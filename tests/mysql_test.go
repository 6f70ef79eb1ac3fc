package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect/dialecttest"
)

// Checks particular to the MySQL/MariaDB dialect, run by
// TestConformanceMySQL as extras of the conformance suite.

// mysqlClientFoundRows runs claims on a connection with the driver's
// clientFoundRows=true, under which a no-op duplicate update reports one
// "found" row: duplicates must still be duplicates.
func mysqlClientFoundRows(t *testing.T, e *dialecttest.Env, dsn string) {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	t.Cleanup(func() { closeChecked(t, db) })
	table := e.Table(t, db)
	mw := e.Middleware(t, db, table, "found-rows")
	fx := e.NewEffects(t, db, table, 1)
	ctx := context.Background()
	bump := func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) }
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate} {
		out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, bump)
		if err != nil || out != want {
			t.Errorf("clientFoundRows=true, delivery %d = %v, %v; want %v", i+1, out, err, want)
		}
	}
	// And concurrently.
	outs := make(chan idempotent.Outcome, 8)
	for i := 0; i < 8; i++ {
		go func() {
			out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "concurrent"}, bump)
			if err != nil {
				t.Error(err)
			}
			outs <- out
		}()
	}
	applied := 0
	for i := 0; i < 8; i++ {
		if <-outs == idempotent.Applied {
			applied++
		}
	}
	if applied != 1 {
		t.Errorf("clientFoundRows=true, 8 concurrent deliveries: %d applied, want 1", applied)
	}
	if n := fx.Get(t, 1); n != 2 {
		t.Errorf("effect %d, want 2 (one per key)", n)
	}
}

// mysqlLockTimeoutRestored checks that WithLockTimeout leaves the session's
// own innodb_lock_wait_timeout on the pooled connection, after a claim that
// succeeded and after one that timed out. The DSN sets a session value (7)
// unlike the server's default, so a reset to DEFAULT would show.
func mysqlLockTimeoutRestored(t *testing.T, e *dialecttest.Env, dsn string) {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = "7"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1) // every statement on the same session
	t.Cleanup(func() { closeChecked(t, db) })
	ctx := context.Background()
	session := func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := session(); n != 7 {
		t.Fatalf("session innodb_lock_wait_timeout %d, want the DSN's 7", n)
	}
	other := e.DB(t)
	table := e.Table(t, other)
	e.Middleware(t, other, table, "lock") // creates the table
	mw, err := idempotent.New(db, e.Dialect(), "lock", idempotent.WithTable(table), idempotent.WithLockTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "free"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Applied {
		t.Fatalf("Process = %v, %v", out, err)
	}
	if n := session(); n != 7 {
		t.Errorf("after an applied claim: session innodb_lock_wait_timeout %d, want 7 restored", n)
	}
	holder, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	plain, err := idempotent.New(other, e.Dialect(), "lock", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := plain.ClaimMessage(ctx, holder, idempotent.Message{Key: "held"}); err != nil || !ok {
		t.Fatalf("holder's Claim = %v, %v", ok, err)
	}
	start := time.Now()
	_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "held"}, func(context.Context, *sql.Tx) error { return nil })
	waited := time.Since(start)
	if !errors.Is(err, idempotent.ErrClaimBusy) {
		t.Fatalf("Process behind the holder = %v, want ErrClaimBusy", err)
	}
	t.Logf("timed out after %v (lock timeout 1s, session's own 7s): %v", waited.Round(10*time.Millisecond), err)
	if n := session(); n != 7 {
		t.Errorf("after a timed-out claim: session innodb_lock_wait_timeout %d, want 7 restored", n)
	}
	// The handler's own waits keep the session's timeout, not the claim's.
	if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "probe"}, func(ctx context.Context, tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&n); err != nil {
			return err
		}
		if n != 7 {
			return fmt.Errorf("inside the handler innodb_lock_wait_timeout is %d, want the session's 7", n)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// mysqlInnoDBRequired gives EnsureSchema a claim table that exists with a
// non-transactional engine: it must refuse it, naming the engine.
func mysqlInnoDBRequired(t *testing.T, e *dialecttest.Env) {
	db := e.DB(t)
	table := e.Table(t, db)
	if _, err := db.Exec("CREATE TABLE " + table + " (consumer VARBINARY(128) NOT NULL, message_key VARBINARY(512) NOT NULL, processed_at DATETIME(6) NOT NULL, claim_flip TINYINT NOT NULL DEFAULT 0, PRIMARY KEY (consumer, message_key)) ENGINE=MyISAM"); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotent.New(db, e.Dialect(), "c", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	err = mw.EnsureSchema(context.Background())
	if err == nil || !strings.Contains(err.Error(), "MyISAM") || !strings.Contains(err.Error(), "InnoDB") {
		t.Fatalf("EnsureSchema on a MyISAM claim table = %v, want an error naming MyISAM and InnoDB", err)
	}
	t.Logf("refused: %v", err)
}

// mysqlNoDatabase connects without a default database: EnsureSchema with an
// unqualified table says what is missing.
func mysqlNoDatabase(t *testing.T, e *dialecttest.Env, dsn string) {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	mw, err := idempotent.New(db, e.Dialect(), "c", idempotent.WithTable("claims_nodb"))
	if err != nil {
		t.Fatal(err)
	}
	err = mw.EnsureSchema(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no database selected") {
		t.Fatalf("EnsureSchema without a database = %v, want \"no database selected\"", err)
	}
	t.Logf("refused: %v", err)
}
