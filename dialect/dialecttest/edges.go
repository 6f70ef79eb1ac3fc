package dialecttest

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/claimfold"
)

// Checks of the batch claim, of what a handler may not do through the
// claim's transaction, of the transaction options and of the optional
// interfaces.

// guardedDB opens a database with the harness's OpenGuarded, like DB.
func (e *Env) guardedDB(t testing.TB) *sql.DB {
	t.Helper()
	if e.h.OpenGuarded == nil {
		t.Fatalf("dialecttest: Harness.OpenGuarded is required (the %s dialect implements dialect.ImplicitCommitter)", e.h.Dialect.Name())
	}
	db, err := e.h.OpenGuarded(t)
	if err != nil {
		t.Fatalf("open the database under test through GuardConnector: %v", err)
	}
	db.SetMaxOpenConns(e.h.MaxConns)
	db.SetMaxIdleConns(4)
	t.Cleanup(func() {
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("connection leak: %d connections still in use", n)
		}
		_ = db.Close()
	})
	return db
}

// checkBatchClaim: a batch applies each distinct new key once, reports
// in-batch repeats and earlier claims as duplicates, and rolls back whole.
func checkBatchClaim(t *testing.T, e *Env) {
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	fx := e.NewEffects(t, db, table, 1)
	keys := []string{"b", "a", "b", "c"}
	var got [][]int
	bump := func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		got = append(got, slices.Clone(fresh))
		for range fresh {
			if err := fx.Bump(ctx, tx, 1); err != nil {
				return err
			}
		}
		return nil
	}
	outs, err := mw.ProcessMessages(ctx, keyMessages(keys...), bump)
	want := []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Duplicate, idempotent.Applied}
	if err != nil || !slices.Equal(outs, want) {
		t.Fatalf("ProcessMessages(%q) = %v, %v; want %v", keys, outs, err, want)
	}
	if len(got) != 1 || !slices.Equal(got[0], []int{0, 1, 3}) {
		t.Fatalf("the batch function saw fresh %v, want one call with [0 1 3]", got)
	}
	// A failing batch rolls back its claims and effects together.
	boom := errors.New("batch handler failed")
	if _, err := mw.ProcessMessages(ctx, keyMessages("d", "a", "e"), func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		if err := bump(ctx, tx, fresh); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failing batch: %v, want the handler's error", err)
	}
	outs, err = mw.ProcessMessages(ctx, keyMessages("e", "c", "d"), bump)
	want = []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Applied}
	if err != nil || !slices.Equal(outs, want) {
		t.Fatalf("batch after the failed one = %v, %v; want %v", outs, err, want)
	}
	// All duplicates: the function does not run, nothing is committed.
	calls := len(got)
	outs, err = mw.ProcessMessages(ctx, keyMessages("a", "e"), bump)
	if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate}) || len(got) != calls {
		t.Fatalf("batch of duplicates = %v, %v (function ran %d more times)", outs, err, len(got)-calls)
	}
	if n, claims := fx.Get(t, 1), e.Claims(t, db, table); n != 5 || !slices.Equal(claims, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("effect %d, claims %q; want 5 and a to e", n, claims)
	}
	// The single claim sees the batch's claims.
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "c"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Duplicate {
		t.Fatalf("ProcessMessage of a key the batch claimed = %v, %v; want duplicate", out, err)
	}
}

// checkLockTimeoutRestored: after a claim with WithLockTimeout, the
// session's lock timeout is what it was before, so the setting never
// reaches unrelated users of the pooled connection; where the dialect resets
// it right after the claim (dialect.LockTimeoutResetter), the handler's own
// waits keep the session's value too. Every statement runs on one session.
func checkLockTimeoutRestored(t *testing.T, e *Env, batch bool) {
	ctx := testContext(t)
	d := e.h.Dialect
	const timeout = 3 * time.Second
	if d.LockTimeoutSQL(timeout) == "" {
		t.Skipf("the %s dialect cannot bound lock waits (LockTimeout checks that New refuses it)", d.Name())
	}
	if e.h.LockTimeoutQuery == "" {
		t.Fatalf("dialecttest: the %s dialect can bound lock waits, so Harness.LockTimeoutQuery is required", d.Name())
	}
	db := e.DB(t)
	db.SetMaxOpenConns(1) // one session for everything below
	table := e.Table(t, db)
	mw := e.Middleware(t, db, table, "conformance", idempotent.WithLockTimeout(timeout))
	read := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) (string, error) {
		var s sql.NullString
		err := q.QueryRowContext(ctx, e.h.LockTimeoutQuery).Scan(&s)
		return s.String, err
	}
	before, err := read(db)
	if err != nil {
		t.Fatalf("%s: %v", e.h.LockTimeoutQuery, err)
	}
	var inside string
	handler := func(ctx context.Context, tx *sql.Tx) error {
		var err error
		inside, err = read(tx)
		return err
	}
	what := "claim"
	if batch {
		what = "batch claim"
		_, err = mw.ProcessMessages(ctx, keyMessages("k1", "k2"), func(ctx context.Context, tx *sql.Tx, _ []int) error { return handler(ctx, tx) })
	} else {
		_, err = mw.ProcessMessage(ctx, idempotent.Message{Key: "k1"}, handler)
	}
	if err != nil {
		t.Fatalf("%s with a lock timeout: %v", what, err)
	}
	after, err := read(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: session lock timeout %q before, %q in the handler, %q after", what, before, inside, after)
	if after != before {
		t.Errorf("after the %s the session's lock timeout is %q, it was %q before: the claim's WithLockTimeout setting stayed on the pooled connection", what, after, before)
	}
	if _, ok := d.(dialect.LockTimeoutResetter); ok && inside != before {
		t.Errorf("in the handler after the %s the session's lock timeout is %q, want the session's own %q restored right after the claim (the dialect is a LockTimeoutResetter)", what, inside, before)
	}
}

// checkImplicitCommit: a handler that runs DDL through the claim's
// transaction and then fails leaves nothing committed — neither the claim,
// nor the effect, nor the table — and its redelivery applies once. Where the
// database commits DDL implicitly (dialect.ImplicitCommitter), the guard
// must refuse the statement before it reaches the database; elsewhere the
// DDL is transactional and rolls back.
func checkImplicitCommit(t *testing.T, e *Env) {
	ctx := testContext(t)
	d := e.h.Dialect
	ic, implicit := d.(dialect.ImplicitCommitter)
	var db *sql.DB
	if implicit {
		db = e.guardedDB(t)
	} else {
		db = e.DB(t)
	}
	table := e.Table(t, db)
	mw := e.Middleware(t, db, table, "conformance")
	fx := e.NewEffects(t, db, table, 1)
	scratch := table + "_ddl"
	dropAtEnd(t, db, scratch)
	ddl := "CREATE TABLE " + scratch + " (id INTEGER)"
	if implicit && !ic.CommitsImplicitly(ddl) {
		t.Fatalf("the dialect is an ImplicitCommitter but says %q does not commit implicitly", ddl)
	}
	var ddlErr error
	failed := errors.New("handler failed after its DDL")
	_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "ddl"}, func(ctx context.Context, tx *sql.Tx) error {
		if err := fx.Bump(ctx, tx, 1); err != nil {
			return err
		}
		_, ddlErr = tx.ExecContext(ctx, ddl)
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("ProcessMessage = %v, want the handler's error", err)
	}
	if implicit {
		if !errors.Is(ddlErr, idempotent.ErrAutocommit) || !errors.Is(err, idempotent.ErrAutocommit) {
			t.Fatalf("DDL through the claim's transaction on a database that commits it implicitly: statement %v, ProcessMessage %v; want ErrAutocommit for both", ddlErr, err)
		}
		t.Logf("refused: %v", ddlErr)
	} else if ddlErr != nil {
		t.Fatalf("DDL through the claim's transaction: %v (the dialect is no ImplicitCommitter, so its DDL should be transactional)", ddlErr)
	}
	if n, claims := fx.Get(t, 1), e.Claims(t, db, table); n != 0 || len(claims) != 0 {
		t.Fatalf("after the failed delivery: effect %d, claims %q; want nothing committed", n, claims)
	}
	if _, err := db.ExecContext(ctx, "SELECT 1 FROM "+scratch); err == nil {
		t.Fatalf("%s exists after the failed delivery: the DDL committed", scratch)
	}
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "ddl"}, func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) }); err != nil || out != want {
			t.Fatalf("redelivery %d = %v, %v; want %v", i+1, out, err, want)
		}
	}
	if n := fx.Get(t, 1); n != 1 {
		t.Fatalf("effect %d after the redeliveries, want 1", n)
	}
}

// allLevels are the isolation levels of database/sql.
var allLevels = []sql.IsolationLevel{
	sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelWriteCommitted,
	sql.LevelRepeatableRead, sql.LevelSnapshot, sql.LevelSerializable, sql.LevelLinearizable,
}

// checkIsolationLevels: New refuses read-only transactions, and, where the
// dialect implements dialect.TxOptionsChecker, every level it refuses, with
// an error naming the level and the dialect; every level it accepts really
// runs a claim on the database.
func checkIsolationLevels(t *testing.T, e *Env) {
	ctx := testContext(t)
	d := e.h.Dialect
	db, table, _ := setup(t, e)
	if _, err := idempotent.New(db, d, "conformance", idempotent.WithTxOptions(sql.TxOptions{ReadOnly: true})); err == nil {
		t.Error("New accepted a read-only transaction, which cannot insert a claim")
	}
	checker, ok := d.(dialect.TxOptionsChecker)
	if !ok {
		t.Logf("the %s dialect does not implement dialect.TxOptionsChecker: New cannot refuse a level its driver will not begin", d.Name())
		return
	}
	if err := checker.CheckTxOptions(sql.TxOptions{ReadOnly: true}); err == nil {
		t.Error("CheckTxOptions accepted ReadOnly")
	}
	var accepted, refused []string
	for _, l := range allLevels {
		opts := sql.TxOptions{Isolation: l}
		cerr := checker.CheckTxOptions(opts)
		mw, err := idempotent.New(db, d, "conformance", idempotent.WithTable(table), idempotent.WithTxOptions(opts))
		if cerr != nil {
			refused = append(refused, l.String())
			if err == nil || !strings.Contains(err.Error(), l.String()) || !strings.Contains(err.Error(), d.Name()) {
				t.Errorf("%v: CheckTxOptions refuses it, New says %v; want an error naming the level and the %s dialect", l, err, d.Name())
			}
			continue
		}
		accepted = append(accepted, l.String())
		if err != nil {
			t.Errorf("%v: New = %v", l, err)
			continue
		}
		if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "level-" + strings.ReplaceAll(l.String(), " ", "-")}, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Applied {
			t.Errorf("%v: the dialect accepts it, but ProcessMessage = %v, %v", l, out, err)
		}
	}
	if !slices.Contains(accepted, sql.LevelDefault.String()) {
		t.Error("the dialect refuses the default isolation level")
	}
	t.Logf("accepted %s; refused %s", strings.Join(accepted, ", "), strings.Join(refused, ", "))
}

// checkCleaner: Cleanup removes claims older than the window plus the
// margin, and only those.
func checkCleaner(t *testing.T, e *Env) {
	if _, ok := e.h.Dialect.(dialect.Cleaner); !ok {
		t.Skipf("the %s dialect does not implement dialect.Cleaner", e.h.Dialect.Name())
	}
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	for _, k := range []string{"x", "y"} {
		if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: k}, func(context.Context, *sql.Tx) error { return nil }); err != nil || out != idempotent.Applied {
			t.Fatalf("ProcessMessage(%q) = %v, %v", k, out, err)
		}
	}
	if n, err := mw.ClaimTable().CleanupConsumer(ctx, mw.Config().Consumer, idempotent.DefaultCleanupOptions()); err != nil || n != 0 {
		t.Fatalf("Cleanup now = %d, %v; want nothing deleted", n, err)
	}
	later := time.Now().Add(idempotent.DefaultRetention + idempotent.DefaultClockSkew + 24*time.Hour)
	aged, err := idempotent.New(db, e.h.Dialect, "conformance", idempotent.WithTable(table), idempotent.WithClock(func() time.Time { return later }))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := aged.ClaimTable().CleanupConsumer(ctx, aged.Config().Consumer, idempotent.DefaultCleanupOptions()); err != nil || n != 2 {
		t.Fatalf("Cleanup a window later = %d, %v; want the 2 claims", n, err)
	}
	if claims := e.Claims(t, db, table); len(claims) != 0 {
		t.Fatalf("claims left after Cleanup: %q", claims)
	}
}

// checkPartitioner: in partitioned mode a message applies once in its
// day's partition; a day inside the window without its partition yet is
// ErrNoPartition (not ErrBeyondRetention) and applies once
// MaintainPartitions has created it.
func checkPartitioner(t *testing.T, e *Env) {
	if _, ok := e.h.Dialect.(dialect.Partitioner); !ok {
		t.Skipf("the %s dialect does not implement dialect.Partitioner", e.h.Dialect.Name())
	}
	ctx := testContext(t)
	db := e.DB(t)
	table := e.Table(t, db)
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mw := e.Middleware(t, db, table, "conformance", idempotent.WithDailyPartitions(1), idempotent.WithClock(clock),
		idempotent.WithRetention(3*24*time.Hour))
	t.Cleanup(func() {
		// Attached partitions go with the claim table; a detached one (on
		// a database where a partition is a table of its own) is left.
		ps, err := mw.ClaimTable().Partitions(context.Background())
		if err != nil {
			return
		}
		for _, p := range ps {
			if !p.Attached {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + schemaOf(table) + p.Name)
			}
		}
	})
	nop := func(context.Context, *sql.Tx) error { return nil }
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "p", EventTime: now.Add(-time.Hour)}, nop); err != nil || out != want {
			t.Fatalf("delivery %d = %v, %v; want %v", i+1, out, err, want)
		}
	}
	now = now.Add(2 * 24 * time.Hour) // no MaintainPartitions since
	_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "q", EventTime: now.Add(-time.Hour)}, nop)
	if !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("a day inside the window without its partition yet: %v, want ErrNoPartition and not ErrBeyondRetention", err)
	}
	if _, err := mw.ClaimTable().MaintainPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "q", EventTime: now.Add(-time.Hour)}, nop); err != nil || out != idempotent.Applied {
		t.Fatalf("once the day's partition exists = %v, %v; want applied", out, err)
	}

	// A week later the days of both claims are past the window: they are
	// dropped with their claims, and the days of the window are there.
	now = now.Add(7 * 24 * time.Hour)
	rep, err := mw.ClaimTable().MaintainPartitions(ctx)
	if err != nil {
		t.Fatalf("MaintainPartitions a week later: %v", err)
	}
	if len(rep.Dropped) < 3 || len(rep.Created) == 0 {
		t.Fatalf("MaintainPartitions a week later dropped %v and created %v; want the old days dropped and the new ones created", rep.Dropped, rep.Created)
	}
	ps, err := mw.ClaimTable().Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := now.Add(-3*24*time.Hour - idempotent.DefaultClockSkew).UTC().Truncate(24 * time.Hour)
	for _, p := range ps {
		if p.Day.Before(first) || !p.Attached {
			t.Errorf("after MaintainPartitions: partition %s (day %s, attached %v) is left", p.Name, p.Day.Format(time.DateOnly), p.Attached)
		}
	}
	if claims := e.Claims(t, db, table); len(claims) != 0 {
		t.Errorf("claims of dropped days are left: %q", claims)
	}
}

// schemaOf returns "schema." for "schema.table", or "".
func schemaOf(table string) string {
	if i := strings.IndexByte(table, '.'); i >= 0 {
		return table[:i+1]
	}
	return ""
}

// checkUpserter: the version-guarded upsert inserts, replaces with a newer
// version, and ignores an equal or older one.
func checkUpserter(t *testing.T, e *Env) {
	if _, ok := e.h.Dialect.(dialect.Upserter); !ok {
		t.Skipf("the %s dialect does not implement dialect.Upserter", e.h.Dialect.Name())
	}
	ctx := testContext(t)
	db := e.DB(t)
	table := e.Table(t, db) + "_state"
	dropAtEnd(t, db, table)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id INTEGER NOT NULL PRIMARY KEY, version INTEGER NOT NULL, status VARCHAR(20) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	up, err := dialect.NewVersionedUpsert(e.h.Dialect, dialect.VersionedUpsert{Table: table, Key: []string{"id"}, Version: "version", Columns: []string{"status"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		version int
		status  string
		applied bool
	}{{2, "paid", true}, {1, "created", false}, {2, "paid", false}, {3, "shipped", true}} {
		applied, err := up.Exec(ctx, db, 1, step.version, step.status)
		if err != nil || applied != step.applied {
			t.Fatalf("upsert version %d = %v, %v; want applied %v", step.version, applied, err, step.applied)
		}
	}
	var version int
	var status string
	if err := db.QueryRowContext(ctx, "SELECT version, status FROM "+table+" WHERE id = 1").Scan(&version, &status); err != nil {
		t.Fatal(err)
	}
	if version != 3 || status != "shipped" {
		t.Fatalf("row is (%d, %q), want (3, shipped)", version, status)
	}
}

// checkClaimFolder: the claim folded with a companion statement reports the
// companion's rows and whether the claim is new, and both commit together.
func checkClaimFolder(t *testing.T, e *Env) {
	if _, ok := e.h.Dialect.(dialect.ClaimFolder); !ok {
		t.Skipf("the %s dialect does not implement dialect.ClaimFolder", e.h.Dialect.Name())
	}
	ctx := testContext(t)
	db, table, mw := setup(t, e)
	counter := table + "_fold"
	dropAtEnd(t, db, counter)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+counter+" (n INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+counter+" (n) VALUES (0)"); err != nil {
		t.Fatal(err)
	}
	fold := func(companion string) (*claimfold.Fold, *sql.Stmt) {
		t.Helper()
		f, ok := claimfold.New(mw, func(int) string { return companion })
		if !ok {
			t.Fatalf("the %s dialect is a dialect.ClaimFolder but did not fold %q", e.h.Dialect.Name(), companion)
		}
		stmt, err := db.PrepareContext(ctx, f.SQL)
		if err != nil {
			t.Fatalf("prepare the folded claim: %v\n%s", err, f.SQL)
		}
		t.Cleanup(func() { _ = stmt.Close() })
		return f, stmt
	}
	count, countStmt := fold("UPDATE " + counter + " SET n = n + 1")
	none, noneStmt := fold("UPDATE " + counter + " SET n = n + 1 WHERE n < 0")
	for _, step := range []struct {
		f       *claimfold.Fold
		stmt    *sql.Stmt
		key     string
		rows    int64
		claimed bool
	}{{count, countStmt, "fold-a", 1, true}, {count, countStmt, "fold-a", 1, false}, {none, noneStmt, "fold-b", 0, true}} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		rows, claimed, err := step.f.Claim(ctx, tx, step.stmt, step.key, time.Time{})
		if err != nil || rows != step.rows || claimed != step.claimed {
			_ = tx.Rollback()
			t.Fatalf("folded claim of %s = (%d, %v, %v), want (%d, %v, nil)", step.key, rows, claimed, err, step.rows, step.claimed)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT n FROM "+counter).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if got := e.Claims(t, db, table); n != 2 || !slices.Equal(got, []string{"fold-a", "fold-b"}) {
		t.Fatalf("after the folds: counter %d, claims %v; want 2 and [fold-a fold-b]", n, got)
	}
}

// keyMessages returns one Message without an event time per key.
func keyMessages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}
