package idempgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"

	"github.com/txclaim/idempotent/idempgx"
)

// BenchmarkGrowth measures ProcessMessage on a claim table already holding
// IDEMPGX_GROWTH_ROWS claims (default 10⁶) against ProcessMessage on an empty
// table, head to head in one run (8 workers, alternating), for three key
// shapes: random UUIDv4, time-ordered UUIDv7, and zero-padded sequential
// numbers. x_faster below 1 is the cost of the full table:
//
//	IDEMPGX_GROWTH_ROWS=1000000 go test -run '^$' -bench Growth -benchtime 3000x -timeout 60m ./idempgx
func BenchmarkGrowth(b *testing.B) {
	rows := 1_000_000
	if v := os.Getenv("IDEMPGX_GROWTH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("IDEMPGX_GROWTH_ROWS=%q: want a positive number", v)
		}
		rows = n
	}
	ctx := context.Background()
	p := newPool(b, 8, os.Getenv("BENCH_PG_PARAMS"))
	s := tempSchema(b, p)
	exec(b, p, "CREATE TABLE "+s+".effects (id bigserial PRIMARY KEY, k text NOT NULL)")
	for _, shape := range []struct {
		name string
		fill string // SQL expression of generate_series's g
		key  func(n int64) string
	}{
		{"uuid4", "gen_random_uuid()::text", func(int64) string { return uuid4() }},
		{"uuid7", uuid7SQL, func(int64) string { return uuid7(time.Now()) }},
		{"sequential", "'order:' || lpad(g::text, 12, '0')", func(n int64) string { return fmt.Sprintf("order:%012d", n) }},
	} {
		func() {
			full, empty := s+".full_"+shape.name, s+".empty_"+shape.name
			mFull, err := idempgx.New(p, "loyalty", idempgx.WithTable(full))
			if err != nil {
				b.Fatal(err)
			}
			mEmpty, err := idempgx.New(p, "loyalty", idempgx.WithTable(empty))
			if err != nil {
				b.Fatal(err)
			}
			for _, m := range []*idempgx.Middleware{mFull, mEmpty} {
				if err := m.EnsureSchema(ctx); err != nil {
					b.Fatal(err)
				}
			}
			start := time.Now()
			exec(b, p, fmt.Sprintf("INSERT INTO %s (consumer, message_key, processed_at) SELECT 'loyalty', %s, now() - (%d - g) * interval '1 ms' FROM generate_series(1, %d) g",
				full, shape.fill, rows, rows))
			exec(b, p, "VACUUM ANALYZE "+full)
			b.Logf("%s: %d claims written in %v", shape.name, rows, time.Since(start).Round(time.Second))
			var seq atomic.Int64
			seq.Store(int64(rows))
			run := func(m *idempgx.Middleware) func() error {
				return func() error {
					k := shape.key(seq.Add(1))
					_, err := m.ProcessMessage(ctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error {
						_, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (k) VALUES ($1)", k)
						return err
					})
					return err
				}
			}
			b.Run(shape.name, func(b *testing.B) { headToHead(b, 0, run(mFull), run(mEmpty), "full", "empty") })
		}()
	}
}

// uuid7SQL is a time-ordered UUIDv7-shaped key for row g of the fill: the
// milliseconds of a time g ms in the past, then random bits.
const uuid7SQL = `(SELECT format('%s-%s-7%s-%s-%s', substr(h, 1, 8), substr(h, 9, 4), substr(r, 1, 3), substr(r, 4, 4), substr(r, 8, 12))
	FROM (SELECT lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint - 86400000 + g), 12, '0') AS h,
	             md5(random()::text || g) AS r) AS x)`

func uuid4() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return format(u)
}

func uuid7(t time.Time) string {
	var u [16]byte
	_, _ = rand.Read(u[6:])
	ms := uint64(t.UnixMilli())
	for i := 0; i < 6; i++ {
		u[i] = byte(ms >> (40 - 8*i))
	}
	u[6] = u[6]&0x0f | 0x70
	u[8] = u[8]&0x3f | 0x80
	return format(u)
}

func format(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
