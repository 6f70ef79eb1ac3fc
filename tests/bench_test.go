package tests

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent/internal/loyaltyload"
)

// BenchmarkLoyalty runs the guide's loyalty workload with 8 concurrent
// workers, side by side in one run: the effect alone, the guide's
// hand-written claim + effect, Process (defaults and strict guard), batches
// of 100, and the duplicate path, with lib/pq and with pgx's stdlib driver.
// The figure to quote is ProcessVsHandWritten's process/handwritten: the
// two alternate operation by operation, so the drift of a shared machine
// cancels, which it does not between separate sub-benchmarks:
//
//	go test -run '^$' -bench 'Loyalty/.*/ProcessVsHandWritten' -benchtime 3000x -count 3 ./tests/
//
// tests/bench/ (go run ./tests/bench) is the fuller harness: it interleaves the variants
// in rounds and reports latency percentiles and round trips.
func BenchmarkLoyalty(b *testing.B) {
	variants := map[string]string{
		"effect": "EffectOnly", "handwritten": "HandWritten", "process": "Process",
		"strict": "ProcessStrictGuard", "batch100": "Batch100", "duplicate": "Duplicate",
	}
	admin := openBatchDB(b, "postgres", 1)
	schema, err := loyaltyload.Setup(context.Background(), admin, uniqueName("bench"), 100000)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := schema.Drop(context.Background(), admin); err != nil {
			b.Error(err)
		}
	})
	var orderIDs atomic.Int64
	var seed atomic.Uint64
	for _, drv := range []string{"postgres", "pgx"} {
		b.Run("driver="+drv, func(b *testing.B) {
			db := openBatchDB(b, drv, 8)
			env, err := loyaltyload.NewEnv(db, nil, schema, drv == "pgx")
			if err != nil {
				b.Fatal(err)
			}
			warmUp(b, env, schema, &orderIDs)
			for _, v := range loyaltyload.Variants() {
				name, ok := variants[v.Name]
				if !ok {
					continue
				}
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						g := loyaltyload.NewGen(schema, &orderIDs, seed.Add(1))
						ctx := context.Background()
						for pb.Next() {
							if err := v.Run(ctx, env, g); err != nil {
								b.Error(err)
								return
							}
						}
					})
					b.ReportMetric(float64(b.N*v.PerCall)/b.Elapsed().Seconds(), "msgs/s")
				})
			}
			b.Run("ProcessVsHandWritten", func(b *testing.B) { headToHead(b, env, schema, &orderIDs, &seed) })
		})
	}
}

// headToHead alternates the guide's hand-written claim + effect and Process
// operation by operation on every goroutine, so that both meet the same
// machine, and reports the ratio of their throughputs (mean hand-written
// latency over mean Process latency: above 1 means Process is faster) as
// "process/handwritten". It is the figure to quote on a shared machine,
// where separate sub-benchmarks drift apart.
func headToHead(b *testing.B, env *loyaltyload.Env, schema *loyaltyload.Schema, orderIDs *atomic.Int64, seed *atomic.Uint64) {
	var hwNs, hwN, pNs, pN atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		g := loyaltyload.NewGen(schema, orderIDs, seed.Add(1))
		ctx := context.Background()
		process := seed.Load()%2 == 0
		var hw, hwc, p, pc int64
		for pb.Next() {
			process = !process
			t := time.Now()
			var err error
			if process {
				err = env.Process(ctx, g)
				p, pc = p+int64(time.Since(t)), pc+1
			} else {
				err = env.HandWritten(ctx, g)
				hw, hwc = hw+int64(time.Since(t)), hwc+1
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
		hwNs.Add(hw)
		hwN.Add(hwc)
		pNs.Add(p)
		pN.Add(pc)
	})
	if hwN.Load() > 0 && pN.Load() > 0 {
		hwMean := float64(hwNs.Load()) / float64(hwN.Load())
		pMean := float64(pNs.Load()) / float64(pN.Load())
		b.ReportMetric(hwMean/pMean, "process/handwritten")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// warmUp runs every variant a few times on 8 goroutines, so that the
// benchmarks find the pool's connections open and pgx's statement caches
// filled: a cold first iteration would otherwise dominate the small b.N the
// benchmark framework starts with.
func warmUp(b *testing.B, env *loyaltyload.Env, schema *loyaltyload.Schema, orderIDs *atomic.Int64) {
	b.Helper()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := loyaltyload.NewGen(schema, orderIDs, uint64(1000+i))
			for range 5 {
				for _, v := range loyaltyload.Variants() {
					if v.Name == "guarded" {
						continue
					}
					if err := v.Run(context.Background(), env, g); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
