package mocks_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// now is the clock of the event-time tests.
var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

const effectSQL = "UPDATE balances SET points = points + 50 WHERE customer_id = 7"

func effect(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, effectSQL)
	return err
}

func expectEffect(m *mocks.Mock) {
	m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
}

var fastRetry = idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3})

// newMiddleware returns a Postgres Middleware on a new mock and the Mock
// that ForMiddleware reads from it, with no option repeated.
func newMiddleware(t *testing.T, opts ...idempotent.Option) (*idempotent.Middleware, *mocks.Mock) {
	t.Helper()
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", append([]idempotent.Option{fastRetry}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw, mocks.ForMiddleware(mock, mw)
}

// configs are the Middleware's optional statements the helpers must follow.
var configs = []struct {
	name string
	opts []idempotent.Option
}{
	{"defaults", nil},
	{"table", []idempotent.Option{idempotent.WithTable("shop.claims")}},
	{"lock-timeout", []idempotent.Option{idempotent.WithLockTimeout(1500 * time.Millisecond)}},
	{"strict-guard", []idempotent.Option{idempotent.WithStrictGuard()}},
	{"all", []idempotent.Option{idempotent.WithTable("claims"), idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard()}},
}

// TestBatch runs ProcessMessages of messages without event times against
// the batch scripts: the Postgres dialect claims the whole batch with one
// query of its distinct keys in ascending order, returning the new ones.
func TestBatch(t *testing.T) {
	keys := []string{"c", "a", "b", "a"}
	scenarios := []struct {
		name   string
		script func(m *mocks.Mock)
		want   []idempotent.Outcome
		fresh  []int
	}{
		{"some-new", func(m *mocks.Mock) {
			m.ExpectBatchApplied(keys, "a", "c")
			expectEffect(m)
			m.ExpectCommit()
		}, []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate}, []int{0, 1}},
		{"all-duplicate", func(m *mocks.Mock) {
			m.ExpectBatchDuplicate(keys)
		}, []idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate}, nil},
		{"retryable-then-applied", func(m *mocks.Mock) {
			m.ExpectBatchClaimError(keys, &pq.Error{Code: "40P01"})
			m.ExpectBatchApplied(keys, "b")
			expectEffect(m)
			m.ExpectCommit()
		}, []idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate, idempotent.Applied, idempotent.Duplicate}, []int{2}},
	}
	for _, cfg := range configs {
		for _, sc := range scenarios {
			t.Run(cfg.name+"/"+sc.name, func(t *testing.T) {
				t.Parallel()
				mw, m := newMiddleware(t, cfg.opts...)
				sc.script(m)
				var fresh []int
				got, err := mw.ProcessMessages(context.Background(), keyMessages(keys...), func(ctx context.Context, tx *sql.Tx, f []int) error {
					fresh = f
					return effect(ctx, tx)
				})
				if err != nil || !slices.Equal(got, sc.want) || !slices.Equal(fresh, sc.fresh) {
					t.Fatalf("got (%v, %v), fresh %v; want (%v, nil), fresh %v", got, err, fresh, sc.want, sc.fresh)
				}
			})
		}
	}
	t.Run("claim-fatal", func(t *testing.T) {
		mw, m := newMiddleware(t)
		fatal := &pq.Error{Code: "23502"}
		m.ExpectBatchClaimError(keys, fatal)
		_, err := mw.ProcessMessages(context.Background(), keyMessages(keys...), func(context.Context, *sql.Tx, []int) error {
			t.Error("the handler ran")
			return nil
		})
		if !errors.Is(err, fatal) {
			t.Fatalf("got %v, want the claim's error", err)
		}
	})
}

// TestNatural runs ProcessNatural against ExpectNatural: no claim, the
// handler's own insert decides, COMMIT either way.
func TestNatural(t *testing.T) {
	const insert = "INSERT INTO point_ledger (order_id, points) VALUES ($1, $2) ON CONFLICT DO NOTHING"
	for _, cfg := range configs {
		for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
			t.Run(cfg.name+"/"+want.String(), func(t *testing.T) {
				t.Parallel()
				mw, m := newMiddleware(t, cfg.opts...)
				m.ExpectNatural()
				n := int64(0)
				if want == idempotent.Applied {
					n = 1
				}
				m.ExpectExec(insert).WithArgs(9912, 50).WillReturnResult(sqlmock.NewResult(0, n))
				m.ExpectCommit()
				got, err := mw.ProcessNatural(context.Background(), idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx *sql.Tx) (bool, error) {
					res, err := tx.ExecContext(ctx, insert, 9912, 50)
					if err != nil {
						return false, err
					}
					n, err := res.RowsAffected()
					return n == 1, err
				})
				if err != nil || got != want {
					t.Fatalf("got (%v, %v), want %v", got, err, want)
				}
			})
		}
	}
}

// TestEvent runs ProcessMessage of messages with event times against the event-time scripts, in both
// modes: partitioned, the claim carries the event's UTC day.
func TestEvent(t *testing.T) {
	const key = "order-completed:9912"
	// Late on the 29th in New York is the 30th in UTC.
	at := time.Date(2026, 11, 29, 22, 30, 0, 0, time.FixedZone("EST", -5*3600))
	modes := []struct {
		name string
		opts []idempotent.Option
	}{
		{"plain", []idempotent.Option{idempotent.WithClock(clock), idempotent.WithRetention(72 * time.Hour)}},
		{"partitioned", []idempotent.Option{idempotent.WithClock(clock), idempotent.WithRetention(72 * time.Hour), idempotent.WithDailyPartitions(2)}},
		{"partitioned-all", []idempotent.Option{idempotent.WithClock(clock), idempotent.WithDailyPartitions(1),
			idempotent.WithTable("shop.claims"), idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard()}},
	}
	scenarios := []struct {
		name    string
		at      time.Time
		script  func(m *mocks.Mock, at time.Time)
		want    idempotent.Outcome
		wantErr error
	}{
		{"applied", at, func(m *mocks.Mock, at time.Time) {
			m.ExpectAppliedAt(key, at)
			expectEffect(m)
			m.ExpectCommit()
		}, idempotent.Applied, nil},
		{"duplicate", at, func(m *mocks.Mock, at time.Time) {
			m.ExpectDuplicateAt(key, at)
		}, idempotent.Duplicate, nil},
		{"retryable-then-duplicate", at, func(m *mocks.Mock, at time.Time) {
			m.ExpectClaimErrorAt(key, at, &pq.Error{Code: "40001"})
			m.ExpectDuplicateAt(key, at)
		}, idempotent.Duplicate, nil},
		{"beyond-retention", now.Add(-100 * 24 * time.Hour), func(m *mocks.Mock, at time.Time) {
			m.ExpectFenced(at)
		}, 0, idempotent.ErrBeyondRetention},
		{"future", now.Add(time.Hour), func(m *mocks.Mock, at time.Time) {
			m.ExpectFenced(at)
		}, 0, idempotent.ErrInvalidEventTime},
	}
	for _, mode := range modes {
		for _, sc := range scenarios {
			t.Run(mode.name+"/"+sc.name, func(t *testing.T) {
				t.Parallel()
				mw, m := newMiddleware(t, mode.opts...)
				sc.script(m, sc.at)
				got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key, EventTime: sc.at}, effect)
				if sc.wantErr != nil {
					if !errors.Is(err, sc.wantErr) {
						t.Fatalf("got (%v, %v), want %v", got, err, sc.wantErr)
					}
					return
				}
				if err != nil || got != sc.want {
					t.Fatalf("got (%v, %v), want %v", got, err, sc.want)
				}
			})
		}
	}
	t.Run("partitioned/no-partition", func(t *testing.T) {
		mw, m := newMiddleware(t, idempotent.WithClock(clock), idempotent.WithDailyPartitions(1))
		m.ExpectClaimErrorAt(key, at, &pq.Error{Code: "23514"})
		if _, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key, EventTime: at}, effect); !errors.Is(err, idempotent.ErrNoPartition) {
			t.Fatalf("got %v, want ErrNoPartition", err)
		}
	})
	t.Run("partitioned/claim-event", func(t *testing.T) {
		db, mock := mocks.New(t)
		mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithClock(clock), idempotent.WithDailyPartitions(1))
		if err != nil {
			t.Fatal(err)
		}
		m := mocks.ForMiddleware(mock, mw)
		m.ExpectBegin()
		m.ExpectClaimAt(key, at).WillReturnResult(sqlmock.NewResult(0, 1))
		m.ExpectRollback()
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := mw.ClaimMessage(context.Background(), tx, idempotent.Message{Key: key, EventTime: at}); err != nil || !ok {
			t.Fatalf("got (%v, %v), want (true, nil)", ok, err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestForMiddlewareReadsOptions: a Mock that For is not told of the
// Middleware's options does not match, while ForMiddleware with no option
// does.
func TestForMiddlewareReadsOptions(t *testing.T) {
	const key = "order-completed:9912"
	opts := []idempotent.Option{idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard(),
		idempotent.WithClock(clock), idempotent.WithDailyPartitions(1)}
	for _, byMiddleware := range []bool{true, false} {
		db, mock, err := mocks.Open()
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		mw, err := idempotent.New(db, postgres.New(), "loyalty", opts...)
		if err != nil {
			t.Fatal(err)
		}
		m := mocks.For(mock, postgres.New(), "loyalty", mocks.WithClock(clock), mocks.WithDailyPartitions(1))
		if byMiddleware {
			m = mocks.ForMiddleware(mock, mw)
		}
		m.ExpectAppliedAt(key, now)
		expectEffect(m)
		m.ExpectCommit()
		_, perr := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key, EventTime: now}, effect)
		met := perr == nil && mock.ExpectationsWereMet() == nil
		if met != byMiddleware {
			t.Errorf("ForMiddleware %v: script met %v (ProcessMessage: %v)", byMiddleware, met, perr)
		}
	}
}

// TestMisuse: a helper asked for what the Middleware would not send panics
// with a message that says what to use.
func TestMisuse(t *testing.T) {
	_, mock, err := mocks.Open()
	if err != nil {
		t.Fatal(err)
	}
	pg := postgres.New()
	partitioned := func() *mocks.Mock {
		return mocks.For(mock, pg, "c", mocks.WithClock(clock), mocks.WithDailyPartitions(1))
	}
	plain := func() *mocks.Mock { return mocks.For(mock, pg, "c", mocks.WithClock(clock)) }
	cases := []struct {
		name string
		f    func()
		want string
	}{
		{"applied without event time, partitioned", func() { partitioned().ExpectApplied("k") }, "use ExpectAppliedAt"},
		{"claim without event time, partitioned", func() { partitioned().ExpectClaim("k") }, "use ExpectClaimAt"},
		{"batch, partitioned", func() { partitioned().ExpectBatchDuplicate([]string{"k"}) }, "ProcessMessages refuses"},
		{"fenced message scripted as applied", func() { plain().ExpectAppliedAt("k", now.AddDate(0, 0, -31)) }, "use ExpectFenced"},
		{"zero event time", func() { plain().ExpectDuplicateAt("k", time.Time{}) }, "is zero"},
		{"future event time", func() { plain().ExpectClaimErrorAt("k", now.Add(time.Hour), nil) }, "clock-skew margin"},
		{"fence lets it through", func() { plain().ExpectFenced(now) }, "would claim it"},
		{"fresh key not in batch", func() { plain().ExpectBatchApplied([]string{"a"}, "b") }, `"b" is not in the batch`},
		{"no fresh key", func() { plain().ExpectBatchApplied([]string{"a"}) }, "ExpectBatchDuplicate"},
		{"empty batch", func() { plain().ExpectBatchDuplicate(nil) }, "empty batch"},
		{"partitioned schema", func() { partitioned().ExpectEnsureSchema("PostgreSQL 16") }, "not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				p := recover()
				if s, ok := p.(string); !ok || !strings.Contains(s, c.want) {
					t.Fatalf("panic %v, want one containing %q", p, c.want)
				}
			}()
			c.f()
		})
	}
	t.Run("options", func(t *testing.T) {
		for _, o := range []mocks.Option{mocks.WithRetention(0), mocks.WithClockSkew(-time.Second), mocks.WithClock(nil), mocks.WithDailyPartitions(0)} {
			func() {
				defer func() {
					if recover() == nil {
						t.Error("For accepted an invalid option")
					}
				}()
				mocks.For(mock, pg, "c", o)
			}()
		}
	})
}

// TestMessages: ProcessMessages in plain and partitioned mode, scripted by
// ExpectMessagesApplied and ExpectMessagesDuplicate alone.
func TestMessages(t *testing.T) {
	yesterday := now.Add(-20 * time.Hour) // the 29th, UTC
	msgs := []idempotent.Message{
		{Key: "order-completed:2", EventTime: now},
		{Key: "order-completed:1", EventTime: yesterday},
		{Key: "order-completed:2", EventTime: now}, // a duplicate in the batch
	}
	modes := []struct {
		name string
		opts []idempotent.Option
	}{
		{"plain", []idempotent.Option{idempotent.WithClock(clock)}},
		{"partitioned", []idempotent.Option{idempotent.WithClock(clock), idempotent.WithDailyPartitions(1)}},
		{"partitioned-all", []idempotent.Option{idempotent.WithClock(clock), idempotent.WithDailyPartitions(1),
			idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard()}},
	}
	for _, mode := range modes {
		t.Run(mode.name+"/applied", func(t *testing.T) {
			mw, m := newMiddleware(t, mode.opts...)
			m.ExpectMessagesApplied(msgs, "order-completed:1")
			expectEffect(m)
			m.ExpectCommit()
			got, err := mw.ProcessMessages(context.Background(), msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
				if !slices.Equal(fresh, []int{1}) {
					t.Errorf("fresh = %v, want [1]", fresh)
				}
				return effect(ctx, tx)
			})
			want := []idempotent.Outcome{idempotent.Duplicate, idempotent.Applied, idempotent.Duplicate}
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("got (%v, %v), want %v", got, err, want)
			}
		})
		t.Run(mode.name+"/duplicate", func(t *testing.T) {
			mw, m := newMiddleware(t, mode.opts...)
			m.ExpectMessagesDuplicate(msgs)
			got, err := mw.ProcessMessages(context.Background(), msgs, func(context.Context, *sql.Tx, []int) error {
				t.Error("the handler ran for a batch of duplicates")
				return nil
			})
			if err != nil || !slices.Equal(got, []idempotent.Outcome{idempotent.Duplicate, idempotent.Duplicate, idempotent.Duplicate}) {
				t.Fatalf("got (%v, %v), want three duplicates", got, err)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		_, m := newMiddleware(t, idempotent.WithClock(clock), idempotent.WithDailyPartitions(1))
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "message 0's event time") {
				t.Errorf("panic = %v, want one naming message 0's event time", r)
			}
		}()
		m.ExpectMessagesApplied([]idempotent.Message{{Key: "k"}}, "k")
	})
}

// TestHorizon: the claims the table's retention horizon refuses, scripted
// by ExpectBeyondHorizonAt, Claim.WillRefuse and
// ExpectMessagesBeyondHorizon, fail with ErrBeyondRetention; the horizon's
// table is part of EnsureSchema.
func TestHorizon(t *testing.T) {
	const key = "order-completed:9912"
	ctx := context.Background()
	at := now.Add(-30 * time.Hour) // the 29th, UTC
	today := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	modes := []struct {
		name    string
		opts    []idempotent.Option
		horizon time.Time // refuses at
	}{
		{"plain", []idempotent.Option{idempotent.WithClock(clock)}, at},
		{"partitioned", []idempotent.Option{idempotent.WithClock(clock), idempotent.WithDailyPartitions(1)}, today},
		{"partitioned-all", []idempotent.Option{idempotent.WithClock(clock), idempotent.WithDailyPartitions(1),
			idempotent.WithTable("shop.claims"), idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard()}, today},
	}
	for _, mode := range modes {
		t.Run(mode.name+"/process", func(t *testing.T) {
			mw, m := newMiddleware(t, mode.opts...)
			m.ExpectBeyondHorizonAt(key, at, mode.horizon)
			_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, func(context.Context, *sql.Tx) error {
				t.Error("the handler ran")
				return nil
			})
			if !errors.Is(err, idempotent.ErrBeyondRetention) {
				t.Fatalf("got %v, want ErrBeyondRetention", err)
			}
		})
		t.Run(mode.name+"/claim", func(t *testing.T) {
			db, mock := mocks.New(t)
			mw, err := idempotent.New(db, postgres.New(), "loyalty", mode.opts...)
			if err != nil {
				t.Fatal(err)
			}
			m := mocks.ForMiddleware(mock, mw)
			m.ExpectBegin()
			m.ExpectClaimAt(key, at).WillRefuse(mode.horizon)
			m.ExpectClaimAt("other", at).WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectRollback()
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: key, EventTime: at}); ok || !errors.Is(err, idempotent.ErrBeyondRetention) {
				t.Fatalf("refused: got (%v, %v), want ErrBeyondRetention", ok, err)
			}
			if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "other", EventTime: at}); !ok || err != nil {
				t.Fatalf("other: got (%v, %v), want (true, nil)", ok, err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
		})
		t.Run(mode.name+"/batch", func(t *testing.T) {
			mw, m := newMiddleware(t, mode.opts...)
			msgs := []idempotent.Message{{Key: "b", EventTime: now}, {Key: "a", EventTime: at}}
			m.ExpectMessagesBeyondHorizon(msgs, mode.horizon, "a", "b")
			_, err := mw.ProcessMessages(ctx, msgs, func(context.Context, *sql.Tx, []int) error {
				t.Error("the handler ran")
				return nil
			})
			var be *idempotent.BatchKeyError
			if !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, idempotent.ErrBeyondRetention) {
				t.Fatalf("got %v, want a *BatchKeyError at 1 matching ErrBeyondRetention", err)
			}
		})
	}
	t.Run("schema", func(t *testing.T) {
		mw, m := newMiddleware(t, idempotent.WithTable("shop.claims"))
		m.ExpectEnsureSchema("PostgreSQL 16.4")
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("misuse", func(t *testing.T) {
		_, mock, err := mocks.Open() // left with what the helpers scripted before they panicked
		if err != nil {
			t.Fatal(err)
		}
		m := mocks.For(mock, postgres.New(), "loyalty", mocks.WithClock(clock))
		for _, c := range []struct {
			name string
			f    func()
			want string
		}{
			{"horizon at the fence", func() { m.ExpectBeyondHorizonAt(key, at, at.Add(-idempotent.DefaultClockSkew)) }, "would claim it"},
			{"no event time", func() { m.ExpectClaim(key).WillRefuse(now) }, "without an event time"},
			{"claim completed twice", func() {
				c := m.ExpectClaim(key)
				c.WillReturnError(errors.New("x"))
				c.WillReturnResult(sqlmock.NewResult(0, 1))
			}, "already complete"},
			{"batch the horizon lets through", func() {
				m.ExpectMessagesBeyondHorizon([]idempotent.Message{{Key: "a", EventTime: at}, {Key: "b"}}, at.Add(-time.Hour), "a", "b")
			}, "would apply the batch"},
		} {
			t.Run(c.name, func(t *testing.T) {
				defer func() {
					if p, ok := recover().(string); !ok || !strings.Contains(p, c.want) {
						t.Fatalf("panic %v, want one containing %q", p, c.want)
					}
				}()
				c.f()
			})
		}
	})
}

// keyMessages returns one Message without an event time per key.
func keyMessages(keys ...string) []idempotent.Message {
	msgs := make([]idempotent.Message, len(keys))
	for i, k := range keys {
		msgs[i].Key = k
	}
	return msgs
}

// fenceless is the Postgres dialect without its optional abilities: no
// transaction fence, so that its coalesced groups run with savepoints, as
// MySQL's and SQLite's do.
type fenceless struct{ dialect.Dialect }

// TestExpectGroup scripts coalesced groups of three members — the first
// new, the second a duplicate, the third new, each with and without an
// event time — in both designs and with the options that add statements
// around a group's claims and handlers, and the Middleware sends exactly
// that.
func TestExpectGroup(t *testing.T) {
	at := now.Add(-time.Hour)
	for _, tc := range []struct {
		name string
		d    dialect.Dialect
		c    idempotent.Coalescing
		opts []idempotent.Option
	}{
		{"optimistic", postgres.New(), idempotent.Coalescing{}, nil},
		{"optimistic without a lock wait bound", postgres.New(), idempotent.Coalescing{LockWait: -1}, nil},
		{"optimistic with lock timeout and strict guard", postgres.New(), idempotent.Coalescing{}, []idempotent.Option{idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard()}},
		{"savepoints", postgres.New(), idempotent.Coalescing{Savepoints: true}, nil},
		{"savepoints with lock timeout and strict guard", postgres.New(), idempotent.Coalescing{Savepoints: true}, []idempotent.Option{idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard()}},
		{"a dialect without a fence: savepoints", fenceless{postgres.New()}, idempotent.Coalescing{}, nil},
	} {
		for _, withTime := range []bool{false, true} {
			name := tc.name
			if withTime {
				name += "/event times"
			}
			t.Run(name, func(t *testing.T) {
				db, mock := mocks.New(t)
				c := tc.c
				c.Max, c.Wait = 3, time.Second
				opts := append([]idempotent.Option{idempotent.WithCoalescing(c), idempotent.WithClock(clock)}, tc.opts...)
				mw, err := idempotent.New(db, tc.d, "loyalty", opts...)
				if err != nil {
					t.Fatal(err)
				}
				m := mocks.ForMiddleware(mock, mw)
				m.ExpectGroupBegin()
				if withTime {
					m.ExpectGroupAppliedAt("a", at)
					expectEffect(m)
					m.ExpectGroupDuplicateAt("b", at)
					m.ExpectGroupAppliedAt("c", at)
				} else {
					m.ExpectGroupApplied("a")
					expectEffect(m)
					m.ExpectGroupDuplicate("b")
					m.ExpectGroupApplied("c")
				}
				expectEffect(m)
				m.ExpectGroupCommit()
				outs := make(chan string, 3)
				for _, k := range []string{"c", "b", "a"} {
					go func() {
						msg := idempotent.Message{Key: k}
						if withTime {
							msg.EventTime = at
						}
						out, err := mw.ProcessMessage(context.Background(), msg, effect)
						if err != nil {
							t.Errorf("%s: %v", k, err)
						}
						outs <- k + ":" + out.String()
					}()
				}
				var got []string
				for range 3 {
					got = append(got, <-outs)
				}
				slices.Sort(got)
				if strings.Join(got, " ") != "a:applied b:duplicate c:applied" {
					t.Errorf("outcomes %v", got)
				}
				if err := mock.ExpectationsWereMet(); err != nil {
					t.Error(err)
				}
			})
		}
	}
	t.Run("a group of duplicates, then one that runs again without a failed member", func(t *testing.T) {
		mw, m := newMiddleware(t, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second}))
		m.ExpectGroupBegin()
		m.ExpectGroupDuplicate("a")
		m.ExpectGroupDuplicate("b")
		m.ExpectRollback()
		m.ExpectGroupBegin()
		m.ExpectGroupApplied("a")
		m.ExpectExec(effectSQL).WillReturnError(errors.New("bad payload"))
		m.ExpectRollback()
		m.ExpectGroupBegin()
		m.ExpectGroupApplied("b")
		expectEffect(m)
		m.ExpectGroupCommit()
		for round, want := range []string{"a:duplicate b:duplicate", "a:none b:applied"} {
			if got := outcomesTogether(mw, "a", "b"); got != want {
				t.Errorf("round %d: outcomes %s, want %s", round, got, want)
			}
		}
	})
	t.Run("a group of duplicates with savepoints: each RELEASE, the last alone before ROLLBACK", func(t *testing.T) {
		mw, m := newMiddleware(t, idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: true}))
		m.ExpectGroupBegin()
		m.ExpectGroupDuplicate("a")
		m.ExpectGroupDuplicate("b")
		m.ExpectRollback()
		if got := outcomesTogether(mw, "a", "b"); got != "a:duplicate b:duplicate" {
			t.Errorf("outcomes %s", got)
		}
		if err := m.ExpectationsWereMet(); err != nil {
			t.Error(err)
		}
	})
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", what)
			}
		}()
		f()
	}
	db, mock, err := mocks.Open() // the panics leave expectations behind
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := mocks.For(mock, postgres.New(), "loyalty")
	mustPanic("ExpectGroupBegin on a Mock without WithCoalescing", m.ExpectGroupBegin)
	m = mocks.For(mock, postgres.New(), "loyalty", mocks.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second}))
	mustPanic("ExpectGroupApplied before ExpectGroupBegin", func() { m.ExpectGroupApplied("a") })
	mustPanic("ExpectGroupCommit of a group of duplicates", func() {
		m.ExpectGroupBegin()
		m.ExpectGroupDuplicate("a")
		m.ExpectGroupCommit()
	})
}

// outcomesTogether processes a message of each key at once (so that they
// share a coalesced group) and returns their outcomes, "key:outcome" in
// key order.
func outcomesTogether(mw *idempotent.Middleware, keys ...string) string {
	outs := make(chan string, len(keys))
	for _, k := range keys {
		go func() {
			out, _ := mw.ProcessMessage(context.Background(), idempotent.Message{Key: k}, effect)
			outs <- k + ":" + out.String()
		}()
	}
	got := make([]string, 0, len(keys))
	for range keys {
		got = append(got, <-outs)
	}
	slices.Sort(got)
	return strings.Join(got, " ")
}
