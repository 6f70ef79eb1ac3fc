package idempgx_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// BenchmarkHeadToHead measures the pgx-native path against its competitors
// on the guide's loyalty workload (claim, then UPDATE a balance and INSERT a
// ledger row), 8 concurrent workers. Within each sub-benchmark the two
// variants alternate operation by operation on the same workers, so the
// drift of a shared machine cancels; the figure is the ratio of their mean
// latencies, reported as x_faster (above 1: the first variant is faster):
//
//	go test -run '^$' -bench HeadToHead -benchtime 4000x -count 3 ./idempgx
//
// ProcessVsHandWritten: ProcessMessage against hand-written pgx code doing BEGIN,
// claim, effect and COMMIT as separate statements. DuplicateVsSQL: a
// duplicate through ProcessMessage against a duplicate through the database/sql
// Middleware (pgx's stdlib driver). SeenVsDuplicate: a duplicate answered by
// the in-process pre-check against the database duplicate path.
// Allocs/*: allocations per message, one worker; process_event and
// pgx_dup_event are ProcessMessage with an event time (fenced by the
// retention horizon in the claim statement), batch_event a batch of 10 with
// event times (the horizon read after its claim).
//
// rtt_us is the median SELECT 1 round trip, measured before. Across a
// network, where each round trip costs far more than on loopback, the round
// trips the pgx path saves are worth more: the bench command measures that
// through a delaying proxy (go run ./tests/bench -pgx -latency 0,1ms).
func BenchmarkHeadToHead(b *testing.B) {
	ctx := context.Background()
	target := dsn(b)
	rtt := roundTrip(b, target)
	p := newPoolAt(b, target, 8, os.Getenv("BENCH_PG_PARAMS"))
	s, effect := loyalty(b, p)
	table := s + ".claims"
	m, err := idempgx.New(p, "loyalty", idempgx.WithTable(table))
	if err != nil {
		b.Fatal(err)
	}
	if err := m.EnsureSchema(ctx); err != nil {
		b.Fatal(err)
	}
	lru, err := idempotent.NewSeenLRU(1 << 16)
	if err != nil {
		b.Fatal(err)
	}
	ms, err := idempgx.New(p, "loyalty", idempgx.WithTable(table), idempgx.WithSeen(lru))
	if err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("pgx", withOptions(target, os.Getenv("BENCH_PG_PARAMS")))
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	b.Cleanup(func() { _ = db.Close() })
	core, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(table))
	if err != nil {
		b.Fatal(err)
	}
	claimSQL := postgres.New().ClaimSQL(mustTable(b, table))
	next := orders()
	process := func() error {
		k, oid, cid := next()
		_, err := m.ProcessMessage(ctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error { return effect(ctx, tx, cid, oid) })
		return err
	}
	handWritten := func() error {
		k, oid, cid := next()
		tx, err := p.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		tag, err := tx.Exec(ctx, claimSQL, "loyalty", k)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		if err := effect(ctx, tx, cid, oid); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		b.Fatal(err)
	}
	dupPgx := func() error {
		return expect(m.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, func(context.Context, pgx.Tx) error { return nil }))
	}
	dupSQL := func() error {
		return expect(core.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, func(context.Context, *sql.Tx) error { return nil }))
	}
	if _, err := ms.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		b.Fatal(err)
	}
	dupSeen := func() error {
		return expect(ms.ProcessMessage(ctx, idempotent.Message{Key: "dup"}, func(context.Context, pgx.Tx) error { return nil }))
	}
	at := time.Now().Add(-time.Hour)
	processEvent := func() error {
		k, oid, cid := next()
		_, err := m.ProcessMessage(ctx, idempotent.Message{Key: k, EventTime: at}, func(ctx context.Context, tx pgx.Tx) error { return effect(ctx, tx, cid, oid) })
		return err
	}
	dupEvent := func() error {
		return expect(m.ProcessMessage(ctx, idempotent.Message{Key: "dup", EventTime: at}, func(context.Context, pgx.Tx) error { return nil }))
	}
	batch := make([]idempotent.Message, 10)
	batchEvent := func() error {
		for i := range batch {
			k, _, _ := next()
			batch[i] = idempotent.Message{Key: k, EventTime: at}
		}
		_, err := m.ProcessMessages(ctx, batch, func(context.Context, pgx.Tx, []int) error { return nil })
		return err
	}

	// Warm every connection's statement cache.
	for i := 0; i < 64; i++ {
		for _, f := range []func() error{process, handWritten, dupPgx, dupSQL, processEvent, dupEvent, batchEvent} {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("Throughput/process", func(b *testing.B) { throughput(b, process) })
	b.Run("Throughput/handwritten", func(b *testing.B) { throughput(b, handWritten) })
	b.Run("ProcessVsHandWritten", func(b *testing.B) { headToHead(b, rtt, process, handWritten, "process", "handwritten") })
	b.Run("DuplicateVsSQL", func(b *testing.B) { headToHead(b, rtt, dupPgx, dupSQL, "pgx_dup", "sql_dup") })
	b.Run("SeenVsDuplicate", func(b *testing.B) { headToHead(b, rtt, dupSeen, dupPgx, "seen_dup", "pgx_dup") })
	b.Run("SeenVsSQLDuplicate", func(b *testing.B) { headToHead(b, rtt, dupSeen, dupSQL, "seen_dup", "sql_dup") })
	b.Run("Allocs/process", func(b *testing.B) { serial(b, process) })
	b.Run("Allocs/handwritten", func(b *testing.B) { serial(b, handWritten) })
	b.Run("Allocs/pgx_dup", func(b *testing.B) { serial(b, dupPgx) })
	b.Run("Allocs/process_event", func(b *testing.B) { serial(b, processEvent) })
	b.Run("Allocs/pgx_dup_event", func(b *testing.B) { serial(b, dupEvent) })
	b.Run("Allocs/batch_event", func(b *testing.B) { serial(b, batchEvent) })
}

// loyalty creates the guide's loyalty workload in a schema of its own on p
// — 100,000 balances and a ledger — and returns the schema and the effect of
// an order: UPDATE the customer's balance, INSERT a ledger row.
func loyalty(b testing.TB, p *pgxpool.Pool) (string, func(ctx context.Context, tx pgx.Tx, cid, oid int64) error) {
	s := tempSchema(b, p)
	exec(b, p, "CREATE TABLE "+s+".balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0)")
	exec(b, p, "CREATE TABLE "+s+".ledger (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL)")
	exec(b, p, "INSERT INTO "+s+".balances SELECT g, 0 FROM generate_series(1, 100000) g")
	upd := "UPDATE " + s + ".balances SET points = points + 10 WHERE customer_id = $1"
	ins := "INSERT INTO " + s + ".ledger (customer_id, order_id, points) VALUES ($1, $2, 10)"
	return s, func(ctx context.Context, tx pgx.Tx, cid, oid int64) error {
		if _, err := tx.Exec(ctx, upd, cid); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ins, cid, oid)
		return err
	}
}

// orders returns a source of orders: a new message key, its order id and a
// random customer.
func orders() func() (string, int64, int64) {
	prefix := testenv.UniqueName("o")
	var seq atomic.Int64
	return func() (string, int64, int64) {
		n := seq.Add(1)
		return prefix + ":" + strconv.FormatInt(n, 10), n, 1 + rand.Int64N(100000)
	}
}

func expect(o idempotent.Outcome, err error) error {
	if err == nil && o != idempotent.Duplicate {
		return fmt.Errorf("outcome %v, want duplicate", o)
	}
	return err
}

// headToHead runs a and bb alternately on 8 workers and reports the ratio
// of bb's mean latency to a's: how many times faster a is, with rtt, the
// round trip to the server measured before (rtt_us).
func headToHead(b *testing.B, rtt time.Duration, a, bb func() error, an, bn string) {
	var ta, tb, na, nb atomic.Int64
	b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(2)
		for pb.Next() {
			f, t, n := a, &ta, &na
			if i%2 == 1 {
				f, t, n = bb, &tb, &nb
			}
			i++
			start := time.Now()
			if err := f(); err != nil {
				b.Error(err)
				return
			}
			t.Add(int64(time.Since(start)))
			n.Add(1)
		}
	})
	if na.Load() == 0 || nb.Load() == 0 {
		return
	}
	ma := float64(ta.Load()) / float64(na.Load())
	mb := float64(tb.Load()) / float64(nb.Load())
	b.ReportMetric(ma/1e3, an+"_us/op")
	b.ReportMetric(mb/1e3, bn+"_us/op")
	b.ReportMetric(mb/ma, "x_faster")
	if rtt > 0 {
		b.ReportMetric(float64(rtt)/1e3, "rtt_us")
	}
}

func serial(b *testing.B, f func() error) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
}

func mustTable(b testing.TB, name string) dialect.Table {
	t, err := dialect.ParseTable(name)
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// throughput runs f on 8 workers alone and reports messages per second,
// the figure to hold against pgbench's (sql-limit.sh).
func throughput(b *testing.B, f func() error) {
	b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := f(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
}
