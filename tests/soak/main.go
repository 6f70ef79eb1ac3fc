// Command soak is the fault-injection soak test of the idempotent
// middleware.
//
// It creates a throwaway PostgreSQL cluster of its own (initdb into a
// temporary directory, its own port, a Unix socket in that directory; as
// root the server runs as the postgres OS user), never the machine's shared
// server, and a synchronous streaming standby of it (pg_basebackup -R,
// synchronous_standby_names, synchronous_commit = on). Two lanes, one under READ COMMITTED and one under SERIALIZABLE,
// each run several consumer processes — this same binary, re-executed —
// that credit loyalty points for a stream of OrderCompleted deliveries
// leased from an inbox table: at-least-once, with a share of duplicate
// deliveries (some concurrent, some replayed out of order, later).
//
// Meanwhile a fault injector, on a schedule drawn from the seed, kills
// consumer backends with pg_terminate_backend in the middle of the handler
// and in the middle of COMMIT, SIGKILLs consumer processes and restarts
// them, crashes and restarts PostgreSQL itself once, and fails over once:
// it kills the primary's every process with SIGKILL, promotes the standby
// with pg_ctl promote, and moves the consumers' connection proxies to it (as
// a virtual IP would); the producer and the injector follow through a
// multi-host DSN with target_session_attrs=read-write. The audit runs on
// the promoted standby.
//
// Then the inbox is drained and the audit checks, per lane: every
// customer's points equal the sum over their distinct orders exactly; every
// order has exactly one ledger row and one claim (nothing lost, nothing
// doubled); no consumer reported a connection in use at exit, and no client
// backend is left on the cluster. It exits non-zero if the audit fails or
// a fault type was never injected, printing the seed to replay. Every
// -progress (5 s) it prints a line of the orders published, the deliveries
// processed and the faults injected so far, and while it drains, the
// deliveries left. To replay a seed:
//
//	go run ./tests/soak -duration 60s -seed 42
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if os.Getenv(consumerEnv) != "" {
		os.Exit(runConsumerFromEnv())
	}
	cfg := defaultSoakConfig()
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long messages are produced and faults injected (the drain and audit come after)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed of the message stream and the fault schedule; 0 draws one (printed, for replay)")
	flag.IntVar(&cfg.Consumers, "consumers", cfg.Consumers, "consumer processes per isolation level")
	flag.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent deliveries per consumer process")
	flag.IntVar(&cfg.Coalesce, "coalesce", 0, "WithCoalescing: each consumer's workers share transactions of up to this many deliveries (0: one transaction each)")
	flag.Float64Var(&cfg.DupShare, "dup", cfg.DupShare, "share of deliveries that are duplicates of an earlier order (0 to 0.9)")
	flag.IntVar(&cfg.Rate, "rate", cfg.Rate, "new orders per second per isolation level")
	flag.IntVar(&cfg.Customers, "customers", cfg.Customers, "customers (fewer means hotter balance rows)")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", cfg.FaultEvery, "mean time between injected faults")
	flag.DurationVar(&cfg.Progress, "progress", cfg.Progress, "time between progress lines (orders, deliveries, faults so far); 0 prints none")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the throwaway cluster's directory (log and data) after the run")
	flag.Parse()
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	res, err := runSoak(ctx, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\nsoak: FAIL seed=%d (replay: go run ./tests/soak -duration %v -seed %d)\n", err, cfg.Seed, cfg.Duration, cfg.Seed)
		os.Exit(1)
	}
	if !res.ok() {
		fmt.Fprintf(os.Stderr, "soak: FAIL seed=%d (replay: go run ./tests/soak -duration %v -seed %d)\n", cfg.Seed, cfg.Duration, cfg.Seed)
		os.Exit(1)
	}
}
