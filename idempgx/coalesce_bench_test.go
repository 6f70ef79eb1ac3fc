package idempgx_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// BenchmarkCoalesce measures coalesced transactions (WithCoalescing) on the
// pgx path against ProcessMessage without them, on the guide's loyalty
// workload (claim, UPDATE a balance, INSERT a ledger row), on a pool of 8
// connections, with 32 and 128 concurrent callers: groups of up to 4 and 8
// messages, 1 ms wait, optimistic and with savepoints.
//
//	go test -run '^$' -bench Coalesce -benchtime 20000x -count 3 ./idempgx
//
// Within each sub-benchmark the two variants alternate in slices of 512
// messages (all the callers run one, then the other), so the drift of a
// shared machine cancels; it reports each one's msg/s and x_process, the
// coalesced variant's throughput over ProcessMessage's.
func BenchmarkCoalesce(b *testing.B) {
	ctx := context.Background()
	p := newPoolAt(b, dsn(b), 8, os.Getenv("BENCH_PG_PARAMS"))
	s, effect := loyalty(b, p)
	table := s + ".claims"
	next := orders()
	newMW := func(opts ...idempgx.Option) *idempgx.Middleware {
		m, err := idempgx.New(p, "loyalty", append([]idempgx.Option{idempgx.WithTable(table)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	plain := newMW()
	if err := plain.EnsureSchema(ctx); err != nil {
		b.Fatal(err)
	}
	process := func(m *idempgx.Middleware) func() error {
		return func() error {
			k, oid, cid := next()
			o, err := m.ProcessMessage(ctx, idempotent.Message{Key: k}, func(ctx context.Context, tx pgx.Tx) error { return effect(ctx, tx, cid, oid) })
			if err == nil && o != idempotent.Applied {
				err = fmt.Errorf("outcome %v, want applied", o)
			}
			return err
		}
	}
	base := process(plain)
	for _, callers := range []int{32, 128} {
		for _, v := range []struct {
			name string
			c    idempotent.Coalescing
		}{
			{"co4", idempotent.Coalescing{Max: 4, Wait: time.Millisecond}},
			{"co8", idempotent.Coalescing{Max: 8, Wait: time.Millisecond}},
			{"co4_savepoints", idempotent.Coalescing{Max: 4, Wait: time.Millisecond, Savepoints: true}},
			{"co8_savepoints", idempotent.Coalescing{Max: 8, Wait: time.Millisecond, Savepoints: true}},
		} {
			co := process(newMW(idempgx.WithCoalescing(v.c)))
			// Warm every connection's statement cache for both.
			if _, err := inSlices(callers, 2*callers, base, co); err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("callers=%d/%s", callers, v.name), func(b *testing.B) {
				b.ResetTimer()
				d, err := inSlices(callers, b.N, base, co)
				if err != nil {
					b.Fatal(err)
				}
				pm, cm := float64(b.N)/d[0].Seconds(), float64(b.N)/d[1].Seconds()
				b.ReportMetric(pm, "process_msg/s")
				b.ReportMetric(cm, v.name+"_msg/s")
				b.ReportMetric(cm/pm, "x_process")
			})
		}
	}
}

// inSlices runs n messages of each of fs, in slices of 512 messages taken
// in turn, each slice by callers goroutines at once, and returns the time
// each f took in all.
func inSlices(callers, n int, fs ...func() error) ([]time.Duration, error) {
	const slice = 512
	took := make([]time.Duration, len(fs))
	for done := 0; done < n; done += slice {
		m := min(slice, n-done)
		for i, f := range fs {
			d, err := concurrently(callers, m, f)
			if err != nil {
				return nil, err
			}
			took[i] += d
		}
	}
	return took, nil
}

// concurrently runs f n times on callers goroutines and returns how long
// that took.
func concurrently(callers, n int, f func() error) (time.Duration, error) {
	var left atomic.Int64
	left.Store(int64(n))
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := f(); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), first
}
