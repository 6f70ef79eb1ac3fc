package idempgx

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent"
)

// The statements each delivery sends, checked against a scripted
// connection. (pgxmock v4.9.0, the latest, does not compile against pgx
// v5.13's BatchResults and Rows interfaces, so the script is a small fake
// of the connection interface the middleware uses.)

// step is one expected call: a batch of statements or one statement, the
// results it returns and the connection's transaction status after it.
type step struct {
	sql    []string // the batch's statements, or the one statement
	tags   []string // one command tag per statement that succeeded
	err    error    // the failure of the statement after the tags
	status byte     // transaction status after the step ('I', 'T' or 'E')
	closed bool     // the connection is lost after the step
}

type script struct {
	t      *testing.T
	steps  []step
	i      int
	status byte
	closed bool
}

func (s *script) next(sqls ...string) step {
	s.t.Helper()
	if s.i >= len(s.steps) {
		s.t.Fatalf("unexpected %q after the script's end", sqls)
	}
	st := s.steps[s.i]
	s.i++
	if strings.Join(st.sql, "; ") != strings.Join(sqls, "; ") {
		s.t.Fatalf("step %d: got %q, want %q", s.i, sqls, st.sql)
	}
	s.status, s.closed = st.status, st.closed
	return st
}

func (s *script) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	st := s.next(sql)
	if st.err != nil {
		return pgconn.CommandTag{}, st.err
	}
	return pgconn.NewCommandTag(st.tags[0]), nil
}

func (s *script) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	var sqls []string
	for _, q := range b.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	return &scriptResults{st: s.next(sqls...)}
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
func (r *scriptResults) Query() (pgx.Rows, error) { return nil, errors.New("not scripted") }
func (r *scriptResults) QueryRow() pgx.Row        { return nil }
func (r *scriptResults) Close() error             { return nil }
func (r *scriptResults) Tx() pgx.Tx               { return nil }

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

const (
	claimSQL = `INSERT INTO "processed_messages" (consumer, message_key) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	effect   = "UPDATE t SET n = n + 1"
)

var (
	errSerialization = &pgconn.PgError{Code: "40001"}
	errLockTimeout   = &pgconn.PgError{Code: "55P03"}
)

func TestSequence(t *testing.T) {
	runEffect := func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, effect); return err }
	newClaim := step{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 1"}, status: 'T'}
	dupClaim := step{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 0"}, status: 'T'}
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
			got, err := m.Process(context.Background(), "k", tc.fn)
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
		if _, err := m.Process(ctx, tc.key, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := m.ProcessEvent(ctx, "k", time.Now().Add(-31*24*time.Hour), func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Errorf("old event: %v", err)
	}
	if _, err := m.ProcessEvent(ctx, "k", time.Time{}, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Errorf("zero event time: %v", err)
	}
	if _, err := m.ProcessBatch(ctx, make([]string, idempotent.MaxBatchSize+1), func(context.Context, pgx.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrBatchTooLarge) {
		t.Errorf("large batch: %v", err)
	}
	var bke *idempotent.BatchKeyError
	if _, err := m.ProcessBatch(ctx, []string{"a", ""}, func(context.Context, pgx.Tx, []int) error { return nil }); !errors.As(err, &bke) || bke.Index != 1 || !errors.Is(err, idempotent.ErrInvalidKey) {
		t.Errorf("bad batch key: %v", err)
	}
	nested := context.WithValue(ctx, claimKey{}, &attempt{})
	if _, err := m.Process(nested, "k", func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, ErrNested) || !errors.Is(err, idempotent.ErrAutocommit) {
		t.Errorf("nested: %v", err)
	}
	if _, err := New(nil, "orders"); err == nil {
		t.Error("New(nil pool) succeeded")
	}
	s.done()
}

// TestNestedProcessRefused: Process with a handler's context is refused
// before it takes a connection, and the outer delivery goes on.
func TestNestedProcessRefused(t *testing.T) {
	s := &script{t: t, steps: []step{
		{sql: []string{"begin", claimSQL}, tags: []string{"BEGIN", "INSERT 0 1"}, status: 'T'},
		{sql: []string{"commit"}, tags: []string{"COMMIT"}, status: 'I'},
	}}
	m := scripted(t, s)
	var inner error
	o, err := m.Process(context.Background(), "outer", func(ctx context.Context, tx pgx.Tx) error {
		_, inner = m.Process(ctx, "inner", func(context.Context, pgx.Tx) error { return nil })
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
