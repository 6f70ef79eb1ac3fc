package idempgx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// The statements each delivery sends, checked against a scripted
// connection. (pgxmock v4.9.0, the latest release, compiles only against
// pgx v5.10 and older: pgx v5.11 added Rows.TypeMap and v5.12 added
// BatchResults.Tx, neither of which pgxmock implements. The claim's round
// trip needs Batch.BeginTx, new in v5.12, so no pgx version this module can
// require works with pgxmock, and the script is a small fake of the
// connection interface the middleware uses.)

// step is one expected call: a batch of statements or one statement, the
// results it returns and the connection's transaction status after it.
type step struct {
	sql  []string // the batch's statements, or the one statement
	tags []string // one command tag per statement that succeeded
	err  error    // the failure of the statement after the tags
	args []any    // the last statement's arguments, checked when set
	rows []string // the keys the batch claim returns (RETURNING message_key)
	// horizon is the retention horizon the claim (or the read after a
	// batch claim) returns, microseconds since the Unix epoch; nil: none.
	horizon *int64
	status  byte // transaction status after the step ('I', 'T' or 'E')
	closed  bool // the connection is lost after the step
}

type script struct {
	t      *testing.T
	steps  []step
	i      int
	status byte
	closed bool
	// soft: a statement off the script fails the test and the statement
	// (and loses the connection) instead of stopping the goroutine, which
	// may not be the test's (a coalesced group's driver).
	soft bool
}

// errUnscripted is a soft script's answer to a statement off the script.
var errUnscripted = errors.New("statement off the script")

func (s *script) next(args []any, sqls ...string) step {
	s.t.Helper()
	fail := s.t.Fatalf
	if s.soft {
		fail = s.t.Errorf
	}
	off := func(format string, a ...any) step {
		fail(format, a...)
		s.closed = true
		return step{err: errUnscripted, closed: true}
	}
	if s.i >= len(s.steps) {
		return off("unexpected %q after the script's end", sqls)
	}
	st := s.steps[s.i]
	s.i++
	if strings.Join(st.sql, "; ") != strings.Join(sqls, "; ") {
		return off("step %d: got %q, want %q", s.i, sqls, st.sql)
	}
	if st.args != nil && !reflect.DeepEqual(args, st.args) {
		return off("step %d: arguments %#v, want %#v", s.i, args, st.args)
	}
	s.status, s.closed = st.status, st.closed
	return st
}

func (s *script) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	st := s.next(args, sql)
	if st.err != nil {
		return pgconn.CommandTag{}, st.err
	}
	return pgconn.NewCommandTag(st.tags[0]), nil
}

func (s *script) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	var sqls []string
	var args []any
	for _, q := range b.QueuedQueries {
		sqls = append(sqls, q.SQL)
		args = q.Arguments
	}
	return &scriptResults{st: s.next(args, sqls...)}
}

func (s *script) Query(context.Context, string, ...any) (pgx.Rows, error) {
	s.t.Fatal("Query not scripted")
	return nil, nil
}

func (s *script) QueryRow(context.Context, string, ...any) pgx.Row {
	s.t.Fatal("QueryRow not scripted")
	return nil
}

func (s *script) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	s.t.Fatal("CopyFrom not scripted")
	return 0, nil
}

func (s *script) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	s.t.Fatal("Prepare not scripted")
	return nil, nil
}

func (s *script) done() {
	s.t.Helper()
	if s.i != len(s.steps) {
		s.t.Fatalf("%d of %d steps run; next: %q", s.i, len(s.steps), s.steps[s.i].sql)
	}
}

type scriptResults struct {
	st step
	n  int
}

func (r *scriptResults) Exec() (pgconn.CommandTag, error) {
	defer func() { r.n++ }()
	if r.n < len(r.st.tags) {
		return pgconn.NewCommandTag(r.st.tags[r.n]), nil
	}
	if r.st.err != nil {
		return pgconn.CommandTag{}, r.st.err
	}
	return pgconn.CommandTag{}, errors.New("no result scripted")
}

// Query returns the batch claim's rows, or the step's failure.
func (r *scriptResults) Query() (pgx.Rows, error) {
	defer func() { r.n++ }()
	if r.n != len(r.st.tags) {
		return nil, fmt.Errorf("Query for statement %d, want it for statement %d", r.n+1, len(r.st.tags)+1)
	}
	if r.st.err != nil {
		return nil, r.st.err
	}
	return &keyRows{keys: r.st.rows, i: -1}, nil
}

// QueryRow returns the single claim's row — the count its tag says it
// inserted, and the step's horizon — or, after a batch claim, the horizon's.
func (r *scriptResults) QueryRow() pgx.Row {
	defer func() { r.n++ }()
	switch {
	case r.n < len(r.st.tags):
		return horizonRow{n: pgconn.NewCommandTag(r.st.tags[r.n]).RowsAffected(), h: r.st.horizon, claim: true}
	case r.n == len(r.st.tags) && r.st.err != nil:
		return errRow{r.st.err}
	case r.n == len(r.st.tags)+1 && r.st.err == nil:
		// The statement after the batch claim (read by Query).
		return horizonRow{h: r.st.horizon}
	}
	return errRow{errors.New("no result scripted")}
}
func (r *scriptResults) Close() error { return nil }
func (r *scriptResults) Tx() pgx.Tx   { return nil }

// horizonRow is the single claim's row (inserted count, horizon) or the
// horizon's alone.
type horizonRow struct {
	n     int64
	h     *int64
	claim bool
}

func (r horizonRow) Scan(dest ...any) error {
	if r.claim {
		if len(dest) != 2 {
			return fmt.Errorf("scan of %d values, the claim's row has 2", len(dest))
		}
		*dest[0].(*int64) = r.n
		dest = dest[1:]
	}
	if len(dest) != 1 {
		return fmt.Errorf("scan of %d values, the horizon's row has 1", len(dest))
	}
	*dest[0].(**int64) = r.h
	return nil
}

// keyRows is a result of one text column, the keys a batch claim returns.
type keyRows struct {
	keys   []string
	i      int
	closed bool
}

func (r *keyRows) Close()     { r.closed = true }
func (r *keyRows) Err() error { return nil }
func (r *keyRows) CommandTag() pgconn.CommandTag {
	return pgconn.NewCommandTag(fmt.Sprintf("INSERT 0 %d", len(r.keys)))
}
func (r *keyRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *keyRows) Conn() *pgx.Conn                              { return nil }
func (r *keyRows) TypeMap() *pgtype.Map                         { return pgtype.NewMap() }
func (r *keyRows) Next() bool {
	if r.closed || r.i+1 >= len(r.keys) {
		r.closed = true
		return false
	}
	r.i++
	return true
}
func (r *keyRows) Scan(dest ...any) error {
	if len(dest) != 1 {
		return fmt.Errorf("scan of %d values, the row has 1", len(dest))
	}
	p, ok := dest[0].(*string)
	if !ok {
		return fmt.Errorf("scan into %T, want *string", dest[0])
	}
	*p = r.keys[r.i]
	return nil
}
func (r *keyRows) Values() ([]any, error) { return []any{r.keys[r.i]}, nil }
func (r *keyRows) RawValues() [][]byte    { return [][]byte{[]byte(r.keys[r.i])} }

// scripted returns a Middleware whose every attempt gets s's connection.
func scripted(t *testing.T, s *script, opts ...Option) *Middleware {
	t.Helper()
	db, err := sql.Open("pgx", "postgres://unused.invalid/x")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	fast := WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Microsecond, MaxBackoff: time.Microsecond})
	m, err := newMiddleware(db, "orders", append([]Option{fast}, opts...))
	if err != nil {
		t.Fatal(err)
	}
	m.acquire = func(context.Context) (lease, error) { return lease{c: s}, nil }
	m.status = func(*lease) (byte, bool) { return s.status, s.closed }
	return m
}

var (
	// fencedSQL is the claim of a message with an event time, the horizon
	// folded in; horizonSQL the horizon's read after a batch claim (both
	// golden in postgres/testdata).
	fencedSQL     = postgres.New().HorizonClaimQuerySQL(dialect.Table{Name: "processed_messages"}, false)
	horizonSQL, _ = postgres.New().HorizonSQL(dialect.Table{Name: "processed_messages"}, "orders")
)

const (
	claimSQL = `INSERT INTO "processed_messages" (consumer, message_key) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	batchSQL = `INSERT INTO "processed_messages" (consumer, message_key) ` +
		`SELECT $1, k FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i ` +
		`ON CONFLICT DO NOTHING RETURNING message_key`
	effect = "UPDATE t SET n = n + 1"
)

var (
	errSerialization = &pgconn.PgError{Code: "40001"}
	errLockTimeout   = &pgconn.PgError{Code: "55P03"}
)

func TestSequence(t *testing.T) {
	runEffect := func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, effect); return err }
	newClaim := step{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 1"}, args: []any{"orders", "k"}, status: 'T'}
	dupClaim := step{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 0"}, args: []any{"orders", "k"}, status: 'T'}
	failedClaim := func(err error) step {
		return step{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN"}, err: err, status: 'E'}
	}
	runs := step{sql: []string{effect}, tags: []string{"UPDATE 1"}, status: 'T'}
	commit := step{sql: []string{"commit"}, tags: []string{"COMMIT"}, status: 'I'}
	rollback := step{sql: []string{"rollback"}, tags: []string{"ROLLBACK"}, status: 'I'}

	for _, tc := range []struct {
		name     string
		opts     []Option
		steps    []step
		fn       Func
		want     idempotent.Outcome
		wantErr  error
		attempts int
	}{
		{name: "new: begin and claim in one batch, effect, commit",
			steps: []step{newClaim, runs, commit}, fn: runEffect, want: idempotent.Applied},
		{name: "duplicate: begin and claim, rollback, no handler",
			steps: []step{dupClaim, rollback},
			fn:    func(context.Context, pgx.Tx) error { return errors.New("handler ran") }, want: idempotent.Duplicate},
		{name: "isolation level travels with begin", opts: []Option{WithIsolation(pgx.Serializable)},
			steps: []step{{sql: []string{"begin isolation level serializable", claimSQL}, tags: []string{"BEGIN", "INSERT 0 1"}, status: 'T'}, runs, commit},
			fn:    runEffect, want: idempotent.Applied},
		{name: "lock timeout travels with begin", opts: []Option{WithLockTimeout(250 * time.Millisecond)},
			steps: []step{{sql: []string{"begin", "SET LOCAL lock_timeout = 250", claimSQL}, tags: []string{"BEGIN", "SET", "INSERT 0 1"}, status: 'T'}, runs, commit},
			fn:    runEffect, want: idempotent.Applied},
		{name: "claim's serialization failure: rollback, retried",
			steps: []step{failedClaim(errSerialization), rollback, newClaim, runs, commit}, fn: runEffect, want: idempotent.Applied},
		{name: "claim's lock timeout: ErrClaimBusy, not retried", opts: []Option{WithLockTimeout(time.Second)},
			steps: []step{{sql: []string{"begin", "SET LOCAL lock_timeout = 1000", claimSQL}, tags: []string{"BEGIN", "SET"}, err: errLockTimeout, status: 'E'}, rollback},
			fn:    runEffect, wantErr: idempotent.ErrClaimBusy},
		{name: "serialization failure of the claim's transaction in the handler: retried",
			steps: []step{newClaim, {sql: []string{effect}, err: errSerialization, status: 'E'}, rollback, newClaim, runs, commit},
			fn:    runEffect, want: idempotent.Applied},
		{name: "a 40001 the handler got elsewhere: returned, not retried",
			steps: []step{newClaim, rollback},
			fn:    func(context.Context, pgx.Tx) error { return errSerialization }, wantErr: errSerialization},
		{name: "connection lost in the handler: retried",
			steps: []step{newClaim, {sql: []string{effect}, err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, closed: true}, newClaim, runs, commit},
			fn:    runEffect, want: idempotent.Applied},
		{name: "handler's own error: rollback, returned once",
			steps: []step{newClaim, rollback},
			fn:    func(context.Context, pgx.Tx) error { return errBoom }, wantErr: errBoom},
		{name: "handler commits: refused, rolled back",
			steps: []step{newClaim, rollback},
			fn:    func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }, wantErr: idempotent.ErrAutocommit},
		{name: "handler swallows its refused commit: still rolled back",
			steps: []step{newClaim, rollback},
			fn:    func(ctx context.Context, tx pgx.Tx) error { _ = tx.Rollback(ctx); return nil }, wantErr: idempotent.ErrAutocommit},
		{name: "handler ran COMMIT as a statement: refused",
			steps: []step{newClaim, {sql: []string{"COMMIT"}, tags: []string{"COMMIT"}, status: 'I'}},
			fn:    func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT"); return err }, wantErr: idempotent.ErrAutocommit},
		{name: "commit answered ROLLBACK: the handler hid a failure",
			steps: []step{newClaim, {sql: []string{effect}, err: errors.New("x"), status: 'E'}, {sql: []string{"commit"}, tags: []string{"ROLLBACK"}, status: 'I'}},
			fn:    func(ctx context.Context, tx pgx.Tx) error { _, _ = tx.Exec(ctx, effect); return nil }, wantErr: pgx.ErrTxCommitRollback},
		{name: "serialization at commit: retried",
			steps: []step{newClaim, runs, {sql: []string{"commit"}, err: errSerialization, status: 'I'}, newClaim, runs, commit},
			fn:    runEffect, want: idempotent.Applied},
		{name: "retries exhausted",
			steps: []step{failedClaim(errSerialization), rollback, failedClaim(errSerialization), rollback, failedClaim(errSerialization), rollback},
			fn:    runEffect, wantErr: idempotent.ErrRetriesExhausted},
		{name: "missing claim table: ErrNoClaimTable",
			steps: []step{failedClaim(&pgconn.PgError{Code: "42P01"}), rollback}, fn: runEffect, wantErr: idempotent.ErrNoClaimTable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{t: t, steps: tc.steps}
			m := scripted(t, s, tc.opts...)
			got, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, tc.fn)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			} else if err != nil || got != tc.want {
				t.Fatalf("%v, %v; want %v", got, err, tc.want)
			}
			s.done()
		})
	}
}

var errBoom = errors.New("boom")

// TestBatchSequence: the statements of ProcessMessages. The batch ["c", "b",
// "a", "c"] is claimed as its distinct keys in ascending order, ["a", "b",
// "c"], in one statement after BEGIN; the keys it returns are the new ones.
func TestBatchSequence(t *testing.T) {
	keys := []string{"c", "b", "a", "c"}
	claim := func(rows ...string) step {
		return step{sql: []string{"begin", batchSQL}, tags: []string{"BEGIN"}, args: []any{"orders", []string{"a", "b", "c"}}, rows: rows, status: 'T'}
	}
	failedClaim := step{sql: []string{"begin", batchSQL}, tags: []string{"BEGIN"}, err: errSerialization, status: 'E'}
	runs := step{sql: []string{effect}, tags: []string{"UPDATE 1"}, status: 'T'}
	commit := step{sql: []string{"commit"}, tags: []string{"COMMIT"}, status: 'I'}
	rollback := step{sql: []string{"rollback"}, tags: []string{"ROLLBACK"}, status: 'I'}
	const (
		a = idempotent.Applied
		d = idempotent.Duplicate
	)

	for _, tc := range []struct {
		name      string
		opts      []Option
		steps     []step
		fnErr     error // the function's error, returned after its statement
		want      []idempotent.Outcome
		wantFresh []int // the fresh indexes of the function's last run; nil: it did not run
		wantErr   error
		wantText  string // in the error, when wantErr is nil
	}{
		{name: "new and duplicate keys: begin and one claim, effect, commit",
			steps: []step{claim("a", "c"), runs, commit},
			want:  []idempotent.Outcome{a, d, a, d}, wantFresh: []int{0, 2}},
		{name: "every key a duplicate: rollback, function not run",
			steps: []step{claim(), rollback},
			want:  []idempotent.Outcome{d, d, d, d}},
		{name: "lock timeout travels with begin", opts: []Option{WithLockTimeout(250 * time.Millisecond)},
			steps: []step{{sql: []string{"begin", "SET LOCAL lock_timeout = 250", batchSQL}, tags: []string{"BEGIN", "SET"}, rows: []string{"b"}, status: 'T'}, runs, commit},
			want:  []idempotent.Outcome{d, a, d, d}, wantFresh: []int{1}},
		{name: "claim's serialization failure: rollback, retried",
			steps: []step{failedClaim, rollback, claim("a", "b", "c"), runs, commit},
			want:  []idempotent.Outcome{a, a, a, d}, wantFresh: []int{0, 1, 2}},
		{name: "serialization failure in the function: the retry's claim alone says which keys are new",
			steps: []step{claim("a", "c"), {sql: []string{effect}, err: errSerialization, status: 'E'}, rollback, claim("c"), runs, commit},
			want:  []idempotent.Outcome{a, d, d, d}, wantFresh: []int{0}},
		{name: "function's error: rollback, returned once",
			steps: []step{claim("a"), runs, rollback}, fnErr: errBoom,
			wantFresh: []int{2}, wantErr: errBoom},
		{name: "the database returns a key not in the batch: rollback, error",
			steps:    []step{claim("z"), rollback},
			wantText: `key "z", which is not in the batch`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{t: t, steps: tc.steps}
			m := scripted(t, s, tc.opts...)
			var fresh []int
			got, err := m.ProcessMessages(context.Background(), messages(keys...), func(ctx context.Context, tx pgx.Tx, f []int) error {
				fresh = f
				if _, err := tx.Exec(ctx, effect); err != nil {
					return err
				}
				return tc.fnErr
			})
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			case tc.wantText != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantText) {
					t.Fatalf("err = %v, want one saying %s", err, tc.wantText)
				}
			case err != nil || !reflect.DeepEqual(got, tc.want):
				t.Fatalf("%v, %v; want %v", got, err, tc.want)
			}
			if !reflect.DeepEqual(fresh, tc.wantFresh) {
				t.Fatalf("fresh %v, want %v", fresh, tc.wantFresh)
			}
			s.done()
		})
	}
}

// TestRefusedBeforeSending: bad input and nested calls send nothing.
func TestRefusedBeforeSending(t *testing.T) {
	s := &script{t: t}
	m := scripted(t, s)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		key  string
		want error
	}{
		{"empty key", "", idempotent.ErrInvalidKey},
		{"NUL", "a\x00b", idempotent.ErrInvalidKey},
		{"bad UTF-8", "\xff", idempotent.ErrInvalidKey},
		{"too long", strings.Repeat("k", 2049), idempotent.ErrInvalidKey},
	} {
		if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: tc.key}, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "k", EventTime: time.Now().Add(-31 * 24 * time.Hour)}, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Errorf("old event: %v", err)
	}
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "k", EventTime: time.Now().Add(time.Hour)}, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Errorf("future event time: %v", err)
	}
	if _, err := m.ProcessMessages(ctx, make([]idempotent.Message, idempotent.MaxBatchSize+1), func(context.Context, pgx.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrBatchTooLarge) {
		t.Errorf("large batch: %v", err)
	}
	var bke *idempotent.BatchKeyError
	if _, err := m.ProcessMessages(ctx, []idempotent.Message{{Key: "a"}, {Key: ""}}, func(context.Context, pgx.Tx, []int) error { return nil }); !errors.As(err, &bke) || bke.Index != 1 || !errors.Is(err, idempotent.ErrInvalidKey) {
		t.Errorf("bad batch key: %v", err)
	}
	nested := context.WithValue(ctx, claimKey{}, &attempt{})
	if _, err := m.ProcessMessage(nested, idempotent.Message{Key: "k"}, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, ErrNested) || !errors.Is(err, idempotent.ErrAutocommit) {
		t.Errorf("nested: %v", err)
	}
	if _, err := New(nil, "orders"); err == nil {
		t.Error("New(nil pool) succeeded")
	}
	s.done()
}

// TestNestedProcessRefused: ProcessMessage with a handler's context is refused
// before it takes a connection, and the outer delivery goes on.
func TestNestedProcessRefused(t *testing.T) {
	s := &script{t: t, steps: []step{
		{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 1"}, status: 'T'},
		{sql: []string{"commit"}, tags: []string{"COMMIT"}, status: 'I'},
	}}
	m := scripted(t, s)
	var inner error
	o, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "outer"}, func(ctx context.Context, tx pgx.Tx) error {
		_, inner = m.ProcessMessage(ctx, idempotent.Message{Key: "inner"}, func(context.Context, pgx.Tx) error { return nil })
		return nil
	})
	if err != nil || o != idempotent.Applied {
		t.Fatalf("outer: %v, %v", o, err)
	}
	if !errors.Is(inner, ErrNested) {
		t.Fatalf("inner: %v, want ErrNested", inner)
	}
	s.done()
}

// TestHorizonSequence: the single claim carries the message's fence (its
// event time less the clock-skew margin) and reads the horizon in the same
// statement; a claim not inserted with the fence before the horizon is
// ErrBeyondRetention, otherwise a duplicate. A batch with event times reads
// the horizon in a statement queued after its claim, in the same round
// trip, and a new claim older than it fails the batch naming its message.
func TestHorizonSequence(t *testing.T) {
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	at := now.Add(-10 * 24 * time.Hour)
	fence := at.Add(-time.Minute)
	micros := func(t time.Time) *int64 { v := t.UnixMicro(); return &v }
	opts := []Option{WithClock(func() time.Time { return now }), WithClockSkew(time.Minute), WithRetention(30 * 24 * time.Hour)}
	claim := func(tag string, h *int64) step {
		return step{sql: []string{"begin", fencedSQL}, tags: []string{"BEGIN", tag}, args: []any{"orders", "k", fence}, horizon: h, status: 'T'}
	}
	commit := step{sql: []string{"commit"}, tags: []string{"COMMIT"}, status: 'I'}
	rollback := step{sql: []string{"rollback"}, tags: []string{"ROLLBACK"}, status: 'I'}
	for _, tc := range []struct {
		name    string
		steps   []step
		want    idempotent.Outcome
		wantErr error
	}{
		{"not inserted, fence before the horizon: beyond retention",
			[]step{claim("INSERT 0 0", micros(fence.Add(time.Microsecond))), rollback}, 0, idempotent.ErrBeyondRetention},
		{"not inserted, horizon at the fence: duplicate",
			[]step{claim("INSERT 0 0", micros(fence)), rollback}, idempotent.Duplicate, nil},
		{"not inserted, no horizon: duplicate",
			[]step{claim("INSERT 0 0", nil), rollback}, idempotent.Duplicate, nil},
		{"inserted: applied",
			[]step{claim("INSERT 0 1", micros(fence)), commit}, idempotent.Applied, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{t: t, steps: tc.steps}
			m := scripted(t, s, opts...)
			got, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "k", EventTime: at}, func(context.Context, pgx.Tx) error { return nil })
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), "older than the retention horizon") {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			} else if err != nil || got != tc.want {
				t.Fatalf("%v, %v; want %v", got, err, tc.want)
			}
			s.done()
		})
	}

	t.Run("batch: the horizon read after the claim names the message", func(t *testing.T) {
		msgs := []idempotent.Message{{Key: "b", EventTime: now}, {Key: "a", EventTime: at}}
		s := &script{t: t, steps: []step{
			{sql: []string{"begin", batchSQL, horizonSQL}, tags: []string{"BEGIN"}, args: []any{"orders"}, rows: []string{"a", "b"}, horizon: micros(fence.Add(time.Hour)), status: 'T'},
			rollback,
		}}
		m := scripted(t, s, opts...)
		_, err := m.ProcessMessages(context.Background(), msgs, func(context.Context, pgx.Tx, []int) error { t.Error("the function ran"); return nil })
		var bke *idempotent.BatchKeyError
		if !errors.Is(err, idempotent.ErrBeyondRetention) || !errors.As(err, &bke) || bke.Index != 1 {
			t.Fatalf("err = %v, want ErrBeyondRetention at index 1", err)
		}
		s.done()
	})
}

// messages returns one Message without an event time per key.
func messages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}
