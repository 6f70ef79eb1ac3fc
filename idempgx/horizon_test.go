package idempgx_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/postgres"
)

// execModes are the ways a pool's connections send statements: the
// default (prepared, the claim written straight to pgconn) and the two
// that go through pgx.Batch (a transaction-mode pooler's exec, and the
// simple protocol).
var execModes = []string{"", "default_query_exec_mode=exec", "default_query_exec_mode=simple_protocol"}

func modeName(mode string) string {
	if mode == "" {
		return "prepared"
	}
	return strings.TrimPrefix(mode, "default_query_exec_mode=")
}

// bump is an effect that counts its applications: a second one of the
// same id raises n to 2 (the effects table's id is its primary key).
func bump(s, id string) idempgx.Func {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1", id)
		return err
	}
}

func bumpBatch(s string, msgs []idempotent.Message) idempgx.BatchFunc {
	return func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		for _, i := range fresh {
			if err := bump(s, msgs[i].Key)(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	}
}

// eachMode runs test in a parallel subtest per exec mode, each with a
// pool in that mode, a schema of its own with an effects table, and the
// claim table's name in it.
func eachMode(t *testing.T, test func(t *testing.T, p *pgxpool.Pool, s, table string)) {
	t.Helper()
	for _, mode := range execModes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			var opts []string
			if mode != "" {
				opts = append(opts, mode)
			}
			p := newPool(t, 4, opts...)
			s := tempSchema(t, p)
			exec(t, p, "CREATE TABLE "+s+".effects (id text PRIMARY KEY, n int NOT NULL DEFAULT 1)")
			test(t, p, s, s+".claims")
		})
	}
}

func claimTable(t *testing.T, p *pgxpool.Pool, opts ...idempotent.TableOption) *idempotent.ClaimTable {
	t.Helper()
	db := stdlib.OpenDBFromPool(p)
	t.Cleanup(func() { _ = db.Close() })
	ct, err := idempotent.NewClaimTable(db, postgres.New(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ct
}

// TestHorizonRefusesReplayAfterCleanup: a message is applied by a
// Middleware with a 30-day window; eight days later a ClaimTable with a
// 7-day window cleans the table up, deleting its claim and raising the
// table's horizon. A replay of the message, inside the Middleware's 30-day
// window but older than the horizon, must be refused with
// ErrBeyondRetention, alone or in a batch, and never applied a second
// time; a message inside both windows still applies.
func TestHorizonRefusesReplayAfterCleanup(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, p *pgxpool.Pool, s, table string) {
		ctx := context.Background()
		start := time.Now()
		var clock atomic.Pointer[time.Time]
		clock.Store(&start)
		m, err := idempgx.New(p, "orders", idempgx.WithTable(table), idempgx.WithRetention(30*24*time.Hour),
			idempgx.WithClock(func() time.Time { return *clock.Load() }))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		replay := idempotent.Message{Key: "replay", EventTime: start.Add(-10 * 24 * time.Hour)}
		if o, err := m.ProcessMessage(ctx, replay, bump(s, replay.Key)); err != nil || o != idempotent.Applied {
			t.Fatalf("first delivery: %v, %v", o, err)
		}

		later := start.Add(8 * 24 * time.Hour)
		ct := claimTable(t, p, idempotent.WithTable(table), idempotent.WithRetention(7*24*time.Hour), idempotent.WithClock(func() time.Time { return later }))
		if n, err := ct.Cleanup(ctx, idempotent.DefaultCleanupOptions()); err != nil || n != 1 {
			t.Fatalf("Cleanup: %d, %v; want its one claim deleted", n, err)
		}
		clock.Store(&later)

		// The cases report with Errorf, so that each shows what it got.
		o, err := m.ProcessMessage(ctx, replay, bump(s, replay.Key))
		if !errors.Is(err, idempotent.ErrBeyondRetention) || !strings.Contains(err.Error(), "older than the retention horizon") {
			t.Errorf("replay older than the horizon: %v, %v; want ErrBeyondRetention", o, err)
		}
		fresh := idempotent.Message{Key: "fresh", EventTime: later.Add(-time.Hour)}
		msgs := []idempotent.Message{fresh, replay}
		outs, err := m.ProcessMessages(ctx, msgs, bumpBatch(s, msgs))
		var bke *idempotent.BatchKeyError
		if !errors.Is(err, idempotent.ErrBeyondRetention) || !errors.As(err, &bke) || bke.Index != 1 {
			t.Errorf("batch with the replay: %v, %v; want a BatchKeyError at index 1 matching ErrBeyondRetention", outs, err)
		}
		if n := count(t, p, "SELECT coalesce(sum(n), 0) FROM "+s+".effects WHERE id = 'replay'"); n != 1 {
			t.Fatalf("the replayed message applied %d times, want once", n)
		}
		if n := count(t, p, "SELECT count(*) FROM "+s+".claims"); n != 0 {
			t.Fatalf("%d claims, want none (the refused batch rolled back)", n)
		}
		// Inside both windows: applied, alone and in a batch.
		if o, err := m.ProcessMessage(ctx, fresh, bump(s, fresh.Key)); err != nil || o != idempotent.Applied {
			t.Fatalf("a message inside both windows: %v, %v; want applied", o, err)
		}
		two := []idempotent.Message{{Key: "f2", EventTime: later.Add(-time.Minute)}, fresh}
		if outs, err := m.ProcessMessages(ctx, two, bumpBatch(s, two)); err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate}) {
			t.Fatalf("a batch inside both windows: %v, %v", outs, err)
		}
		// No event time: no horizon refuses it.
		if o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "untimed"}, bump(s, "untimed")); err != nil || o != idempotent.Applied {
			t.Fatalf("a message without an event time: %v, %v; want applied", o, err)
		}
		keys := []idempotent.Message{{Key: "untimed"}, {Key: "untimed-2"}}
		if outs, err := m.ProcessMessages(ctx, keys, bumpBatch(s, keys)); err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Duplicate, idempotent.Applied}) {
			t.Fatalf("a batch without event times: %v, %v", outs, err)
		}
	})
}

// TestHorizonPartitionedDroppedDay: a 7-day ClaimTable's MaintainPartitions
// drops the days a 30-day Middleware still accepts by its window. A
// message of a dropped day — replayed or new, alone or in a batch — is
// ErrBeyondRetention (not ErrNoPartition, whose advice to run
// MaintainPartitions and deliver again would apply it twice); a day after
// the horizon whose partition is missing is still ErrNoPartition.
func TestHorizonPartitionedDroppedDay(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, p *pgxpool.Pool, s, table string) {
		ctx := context.Background()
		now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
		clock := func() time.Time { return now }
		m, err := idempgx.New(p, "orders", idempgx.WithTable(table), idempgx.WithDailyPartitions(2),
			idempgx.WithRetention(30*24*time.Hour), idempgx.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		old := idempotent.Message{Key: "old", EventTime: now.Add(-10 * 24 * time.Hour)} // 2026-02-28
		if o, err := m.ProcessMessage(ctx, old, bump(s, old.Key)); err != nil || o != idempotent.Applied {
			t.Fatalf("first delivery: %v, %v", o, err)
		}
		ct := claimTable(t, p, idempotent.WithTable(table), idempotent.WithDailyPartitions(2),
			idempotent.WithRetention(7*24*time.Hour), idempotent.WithClock(clock))
		rep, err := ct.MaintainPartitions(ctx)
		if err != nil || len(rep.Dropped) == 0 {
			t.Fatalf("MaintainPartitions: %+v, %v; want days dropped", rep, err)
		}

		var bke *idempotent.BatchKeyError
		// The cases report with Errorf, so that each shows what it got.
		for _, msg := range []idempotent.Message{old, {Key: "new-on-a-dropped-day", EventTime: old.EventTime}} {
			if _, err := m.ProcessMessage(ctx, msg, bump(s, msg.Key)); !errors.Is(err, idempotent.ErrBeyondRetention) || errors.Is(err, idempotent.ErrNoPartition) {
				t.Errorf("%s: %v, want ErrBeyondRetention", msg.Key, err)
			}
		}
		msgs := []idempotent.Message{{Key: "today", EventTime: now}, old}
		_, err = m.ProcessMessages(ctx, msgs, bumpBatch(s, msgs))
		if !errors.Is(err, idempotent.ErrBeyondRetention) || errors.Is(err, idempotent.ErrNoPartition) || !errors.As(err, &bke) || bke.Index != 1 {
			t.Errorf("batch with a dropped day: %v, want a BatchKeyError at index 1 matching ErrBeyondRetention", err)
		}

		// After the horizon, a missing partition is still transient.
		exec(t, p, "DROP TABLE "+s+".claims_p20260307")
		gap := idempotent.Message{Key: "gap", EventTime: now.Add(-3 * 24 * time.Hour)}
		if _, err := m.ProcessMessage(ctx, gap, bump(s, gap.Key)); !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Errorf("a missing day after the horizon: %v, want ErrNoPartition", err)
		}
		msgs = []idempotent.Message{{Key: "today", EventTime: now}, gap}
		if _, err := m.ProcessMessages(ctx, msgs, bumpBatch(s, msgs)); !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) {
			t.Errorf("a batch with a missing day after the horizon: %v, want ErrNoPartition", err)
		}

		if n := count(t, p, "SELECT coalesce(sum(n), 0) FROM "+s+".effects"); n != 1 {
			t.Fatalf("%d applications, want the first delivery's alone", n)
		}
		if o, err := m.ProcessMessage(ctx, msgs[0], bump(s, msgs[0].Key)); err != nil || o != idempotent.Applied {
			t.Fatalf("a message of today: %v, %v; want applied", o, err)
		}
	})
}

// TestHorizonRoundTrips: the horizon costs no round trip. With a warm
// connection, a new message with an event time costs two (BEGIN and the
// claim, which reads the horizon; COMMIT), a duplicate two (the same;
// ROLLBACK), and a batch with event times two (BEGIN, the batch claim and
// the horizon's read; COMMIT). Round trips are counted as writes to the
// connection's socket: the middleware waits for the answer to each.
func TestHorizonRoundTrips(t *testing.T) {
	t.Parallel()
	for _, mode := range execModes[:2] {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := dsn(t)
			if mode != "" {
				d = withOptions(d, mode)
			}
			cfg, err := pgxpool.ParseConfig(d)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			var writes atomic.Int64
			dialer := &net.Dialer{}
			cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := dialer.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &countingConn{Conn: c, writes: &writes}, nil
			}
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			s := tempSchema(t, p)
			m, err := idempgx.New(p, "orders", idempgx.WithTable(s+".claims"))
			if err != nil {
				t.Fatal(err)
			}
			if err := m.EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			noop := func(context.Context, pgx.Tx) error { return nil }
			noopBatch := func(context.Context, pgx.Tx, []int) error { return nil }
			at := time.Now().Add(-time.Hour)
			for i, c := range []struct {
				name string
				run  func(key string) error
			}{
				{"new message", func(k string) error {
					_, err := m.ProcessMessage(ctx, idempotent.Message{Key: k, EventTime: at}, noop)
					return err
				}},
				{"duplicate", func(k string) error {
					_, err := m.ProcessMessage(ctx, idempotent.Message{Key: "dup", EventTime: at}, noop)
					return err
				}},
				{"batch", func(k string) error {
					_, err := m.ProcessMessages(ctx, []idempotent.Message{{Key: k + "a", EventTime: at}, {Key: k + "b", EventTime: at}}, noopBatch)
					return err
				}},
			} {
				// Warm: the connection prepares its statements once.
				for w := range 2 {
					if err := c.run("warm" + string(rune('a'+i)) + string(rune('a'+w))); err != nil {
						t.Fatal(err)
					}
				}
				before := writes.Load()
				if err := c.run("measured" + string(rune('a'+i))); err != nil {
					t.Fatal(err)
				}
				if n := writes.Load() - before; n != 2 {
					t.Errorf("%s: %d round trips, want 2", c.name, n)
				}
			}
		})
	}
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}
