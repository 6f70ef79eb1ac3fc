package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// Queued effects (idempgx.Queue) on the real database. The coalescing
// suite runs on the queued path too (designs' "+queued" subtests); these
// are what only queued statements can do.

// violate queues, in tx, an insert into e's strict table that fails its
// CHECK constraint when sent (SQLSTATE 23514).
func (e *coEnv) violate(tx pgx.Tx, k string) error {
	return idempgx.Queue(tx, "INSERT INTO "+e.s+".strict (k, n) VALUES ($1, -1)", k)
}

// strict creates e's strict table: n must be positive.
func (e *coEnv) strict(t *testing.T) {
	t.Helper()
	exec(t, e.p, "CREATE TABLE "+e.s+".strict (k text NOT NULL, n int NOT NULL CHECK (n > 0))")
}

// TestQueuedStatementFailsAlone: a message whose queued statement fails
// (a constraint violation, found only when the statement is sent with the
// next message's claim, or with COMMIT for the last) fails alone with that
// error, nothing of it committed; the others commit. With savepoints
// nobody else runs again; optimistic, the messages before it do.
func TestQueuedStatementFailsAlone(t *testing.T) {
	t.Parallel()
	culprits(t, func(t *testing.T, savepoints bool, culprit int) {
		e := newCoEnv(t, 4)
		e.strict(t)
		keys := []string{"q1", "q2", "q3", "q4"}
		var runs runCounter
		res := callAll(e.mw(t, len(keys), savepoints), keys, func(k string, r *coCall) idempgx.Func {
			return func(ctx context.Context, tx pgx.Tx) error {
				runs.add(k)
				if err := e.apply(ctx, tx, k); err != nil || k != keys[culprit] {
					return err
				}
				return e.violate(tx, k)
			}
		})
		var applied, absent []string
		for i, r := range res {
			if i != culprit {
				if r.Err != nil || r.Outcome != idempotent.Applied {
					t.Errorf("%s: %+v, want applied", keys[i], r)
				}
				applied = append(applied, keys[i])
				continue
			}
			absent = append(absent, keys[i])
			var pe *pgconn.PgError
			if !errors.As(r.Err, &pe) || pe.Code != "23514" || r.Outcome != 0 {
				t.Errorf("%s: %+v, want its queued statement's check violation", keys[i], r)
			}
		}
		want := map[string]int{"q1": 1, "q2": 1, "q3": 1, "q4": 1}
		if !savepoints {
			for _, k := range keys[:culprit] {
				want[k] = 2
			}
		}
		if got := runs.String(); got != fmt.Sprint(want) {
			t.Errorf("handler runs %s, want %v", got, want)
		}
		e.wantAudit(t, applied, absent)
		e.redeliver(t, e.mw(t, len(keys), savepoints), keys)
	})
}

// TestQueuedMixedInOrder: a handler that queues, reads, and queues again
// sees its queued statements' work in its immediate statement's result, and
// they all apply in the order it gave them — alone and in a group.
func TestQueuedMixedInOrder(t *testing.T) {
	t.Parallel()
	for _, coalesced := range []bool{false, true} {
		t.Run(fmt.Sprintf("coalesced=%v", coalesced), func(t *testing.T) {
			t.Parallel()
			designs(t, func(t *testing.T, savepoints bool) {
				e := newCoEnv(t, 4)
				exec(t, e.p, "CREATE TABLE "+e.s+".n (k text PRIMARY KEY, n int NOT NULL)")
				keys := []string{"o1", "o2", "o3"}
				m := e.mw(t, len(keys), savepoints)
				if !coalesced {
					m = e.plain(t)
				}
				res := callAll(m, keys, func(k string, r *coCall) idempgx.Func {
					return func(ctx context.Context, tx pgx.Tx) error {
						if err := idempgx.Queue(tx, "INSERT INTO "+e.s+".n (k, n) VALUES ($1, 1)", k); err != nil {
							return err
						}
						var n int
						if err := tx.QueryRow(ctx, "UPDATE "+e.s+".n SET n = n * 10 WHERE k = $1 RETURNING n", k).Scan(&n); err != nil {
							return err
						}
						if n != 10 {
							return fmt.Errorf("the immediate update saw %d, want 10", n)
						}
						if err := idempgx.Queue(tx, "UPDATE "+e.s+".n SET n = n + 1 WHERE k = $1", k); err != nil {
							return err
						}
						return e.apply(ctx, tx, k)
					}
				})
				for i, r := range res {
					if r.Err != nil || r.Outcome != idempotent.Applied {
						t.Errorf("%s: %+v, want applied", keys[i], r)
					}
					if n := count(t, e.p, "SELECT n FROM "+e.s+".n WHERE k = $1", keys[i]); n != 11 {
						t.Errorf("%s: n = %d, want 11 (inserted 1, times 10, plus 1)", keys[i], n)
					}
				}
				e.wantAudit(t, keys, nil)
			})
		})
	}
}

// TestQueuedSingleFails: alone, a queued statement's failure, found with
// COMMIT, fails the message with its error; neither its claim nor its
// other effects commit, and a redelivery applies it.
func TestQueuedSingleFails(t *testing.T) {
	t.Parallel()
	e := newCoEnv(t, 2)
	e.queued = true
	e.strict(t)
	m := e.plain(t)
	ctx := context.Background()
	msg := idempotent.Message{Key: "s1"}
	o, err := m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		if err := e.apply(ctx, tx, msg.Key); err != nil {
			return err
		}
		return e.violate(tx, msg.Key)
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" || o != 0 {
		t.Fatalf("%v, %v: want the queued statement's check violation", o, err)
	}
	e.wantAudit(t, nil, []string{"s1"})
	if o, err := m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error { return e.apply(ctx, tx, msg.Key) }); err != nil || o != idempotent.Applied {
		t.Fatalf("redelivered: %v, %v", o, err)
	}
	e.wantAudit(t, []string{"s1"}, nil)
}

// TestQueueRefuses: Queue refuses, with ErrNotQueueable and nothing
// queued, a transaction command, a savepoint's transaction, a transaction
// that is not a handler's, and a call after the handler returned.
func TestQueueRefuses(t *testing.T) {
	t.Parallel()
	e := newCoEnv(t, 2)
	m := e.plain(t)
	ctx := context.Background()
	var kept pgx.Tx
	o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "r1"}, func(ctx context.Context, tx pgx.Tx) error {
		kept = tx
		for _, sql := range []string{"COMMIT", " /* x */ rollback", "prepare transaction 'g'", "BEGIN"} {
			if err := idempgx.Queue(tx, sql); !errors.Is(err, idempgx.ErrNotQueueable) {
				return fmt.Errorf("Queue(%q) = %v, want ErrNotQueueable", sql, err)
			}
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := idempgx.Queue(sp, "SELECT 1"); !errors.Is(err, idempgx.ErrNotQueueable) {
			return fmt.Errorf("Queue on a savepoint = %v, want ErrNotQueueable", err)
		}
		if err := sp.Commit(ctx); err != nil {
			return err
		}
		return e.apply(ctx, tx, "r1")
	})
	if err != nil || o != idempotent.Applied {
		t.Fatalf("%v, %v", o, err)
	}
	if err := idempgx.Queue(kept, "SELECT 1"); !errors.Is(err, idempgx.ErrNotQueueable) {
		t.Errorf("Queue after the handler returned = %v, want ErrNotQueueable", err)
	}
	other, err := e.p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if err := idempgx.Queue(other, "SELECT 1"); !errors.Is(err, idempgx.ErrNotQueueable) {
		t.Errorf("Queue on the pool's own transaction = %v, want ErrNotQueueable", err)
	}
	e.wantAudit(t, []string{"r1"}, nil)
}
