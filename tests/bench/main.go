// Command bench measures the idempotent middleware against hand-written SQL
// on the guide's loyalty workload (per message: UPDATE a balance, INSERT a
// ledger row), in one process, against one Postgres.
//
// Usage:
//
//	go run ./bench [-dsn DSN] [-drivers pq,pgx] [-workers 1,8] [-rounds 3] [-cell 2s] [-variants …] [-sql-limit PATH]
//
// For each driver and number of workers it runs every variant for -cell, in
// rounds: each round runs all the variants one after the other, starting
// from a different one each round, so that drift of a shared machine falls
// on all of them alike. It prints a Markdown report: messages per second,
// p50 and p99 latency per call (a call is one transaction: one message, or
// one batch), heap allocations and network writes (round trips) per
// message, and each variant's throughput as a ratio to (a) the effect alone
// and (b) the guide's hand-written claim + effect.
//
// With -growth SIZES it measures instead how Process holds up as the claim
// table grows: Process on a claim table filled to each size against Process
// on an empty one, per key shape (UUIDv4, UUIDv7, sequential), plain and
// partitioned, and -growth-svg FILE draws the ratios as a chart:
//
//	go run ./tests/bench -growth 1000000,10000000 -workers 8 -rounds 5 -cell 3s -growth-svg docs/growth.svg
//
// With -kafka it measures the kafka package's consumers (per record and
// batch) against a hand-written franz-go consumer on an in-process kfake
// cluster, in turn and head to head (package kafkabench):
//
//	go run ./tests/bench -kafka -rounds 3
//
// With -pgx it measures the pgx path (idempgx) against hand-written pgx
// code, its duplicate path against the database/sql one and against the
// in-process pre-check, head to head, and counts allocations; -latency
// adds settings through a proxy that delays each direction (see pgx.go):
//
//	go run ./tests/bench -pgx -latency 0,1ms -rounds 3
//
// With -http it measures the Idempotency-Key middleware (idemhttp) over a
// loopback net/http server and -http-workers clients: the loyalty handler
// without it, with it on database/sql (lib/pq) and on pgx (pgxhttp), and
// the replay of a stored response, alone and head to head (see http.go):
//
//	go run ./tests/bench -http -http-workers 8 -rounds 3
//
// With -coalesce it measures ProcessMessage with and without WithCoalescing
// (variants (c), (g) and (g')) at each of -coalesce-workers, on a direct
// connection and through the latency proxy at each of -latency, on a
// uniform workload and with each share of -hot of the messages on 5
// customers' rows, and reports the retries per message (see coalesce.go):
//
//	go run ./tests/bench -coalesce -coalesce-workers 8,32 -latency 0,1ms -hot 0,0.1 -rounds 2 -cell 1s
//
// -coalesce-conns N gives every setting a pool of N connections however
// many workers call (the connection budget the coalesced groups share),
// and -coalesce-limit PATH runs ../shared/bench/coalesce-limit.sh on each
// network with N clients after its rounds and judges the targets against
// its ratios too:
//
//	go run ./tests/bench -coalesce -coalesce-workers 8,128 -coalesce-conns 8 -coalesce-limit ../shared/bench/coalesce-limit.sh -latency 0,1ms -hot 0,0.1
//
// With -cleanup N it measures Cleanup of N expired claims (beside N/10
// live ones) in batches of 10,000 and 50,000 against the guide's ctid IN
// batch and one DELETE; with -partitions N, MaintainPartitions dropping
// days of N and N/100 claims, -rounds of each; with -outbox, the outbox
// relay's throughput to a local no-op provider (-outbox-rows pending rows)
// and its delay from commit to call (-outbox-messages); see retention.go
// and outbox.go:
//
//	go run ./tests/bench -cleanup 1000000 -partitions 1000000 -outbox -rounds 3
//
// With -adapters it measures each adapter's per-message consumer (NATS,
// RabbitMQ and Redis streams on the local servers, Kafka per record on
// kfake) against ProcessMessage with as many workers and the same effect,
// in turn and head to head (see adapters.go):
//
//	go run ./tests/bench -adapters -adapters-workers 8 -adapters-messages 2000 -rounds 2
//
// and with -adapters-coalesce N each consumer again on a Middleware
// WithCoalescing of groups of up to N, in the same rounds (with
// -adapters-conns C, per message and coalesced on one pool of C
// connections).
//
// With -ordered it measures ordered mode (WithOrdering) against
// ProcessMessage on lib/pq and on pgx (idempgx), call by call in every
// round: a message in order, and a pair that parks then is released (see
// ordered.go):
//
//	go run ./tests/bench -ordered -rounds 5 -ordered-messages 300
//
// Modes combine: -kafka, -pgx, -http, -growth, -cleanup, -partitions,
// -outbox, -coalesce, -adapters and -ordered run each in turn, in that order, after
// the loyalty variants when -loyalty is given too, and print a section
// each, so that one command makes all the sections of BENCHMARKS.md that
// come from this command:
//
//	go run ./tests/bench -loyalty -workers 1,8 -kafka -pgx -latency 0,1ms -growth 1000000 -growth-workers 8 -rounds 3
//
// With -write BENCHMARKS.md the run also puts its sections in that file
// itself: each replaces the section of the same heading (to the next "## "
// heading), or is appended; nothing is copied by hand.
//
// The database comes from -dsn, else IDEMPOTENT_POSTGRES_DSN, else the local
// default. The run works in a schema of its own, dropped at the end; it
// opens at most two pools of the largest worker count at a time.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent/internal/loyaltyload"
)

const localDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

type options struct {
	dsn       string
	drivers   []driverConfig
	workers   []int
	variants  []loyaltyload.Variant
	rounds    int
	cell      time.Duration
	warmup    time.Duration
	customers int
	sqlLimit  string
	h2h       []loyaltyload.Variant // the head-to-head pair, or none
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// plan is what one invocation runs: each mode that is set, in the order
// of the fields.
type plan struct {
	dsn     string
	write   string // -write's file; "" is none
	loyalty *options
	kafka   *kafkaOptions
	pgx     *pgxOptions
	http    *httpOptions
	growth  *growthOptions

	cleanup    *cleanupOptions
	partitions *partitionOptions
	outbox     *outboxOptions
	coalesce   *coalesceOptions
	adapters   *adaptersOptions
	ordered    *orderedOptions
}

// growthOptions is what -growth measures.
type growthOptions struct {
	sizes                  []int
	batch, workers, rounds int
	cell                   time.Duration
	svg                    string
}

func run(args []string, stdout, stderr io.Writer) error {
	p, err := parse(args, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// Sections are separated by one blank line, whatever the blank lines
	// each report ends with.
	var printed strings.Builder // for -write
	if p.write != "" {
		stdout = io.MultiWriter(stdout, &printed)
	}
	out := &tailWriter{w: stdout}
	stdout = out
	section := func() {
		switch {
		case out.n == 0 || out.tail == [2]byte{'\n', '\n'}:
		case out.tail[1] == '\n':
			fmt.Fprintln(stdout)
		default:
			fmt.Fprint(stdout, "\n\n")
		}
	}
	if o := p.loyalty; o != nil {
		section()
		res, env, err := measure(ctx, *o, stderr)
		if err != nil {
			return err
		}
		report(stdout, *o, args, env, res)
		if o.sqlLimit != "" {
			fmt.Fprintf(stderr, "running %s\n", o.sqlLimit)
			fmt.Fprintf(stdout, "\n## The SQL ceiling: pgbench, no Go\n\nCommand: `%s` (8 clients, 8 s per script, prepared statements)\n\n```\n", o.sqlLimit)
			cmd := exec.CommandContext(ctx, "bash", o.sqlLimit)
			cmd.Stdout, cmd.Stderr = stdout, stderr
			err := cmd.Run()
			fmt.Fprintln(stdout, "```")
			if err != nil {
				return fmt.Errorf("%s: %w", o.sqlLimit, err)
			}
		}
	}
	if p.kafka != nil {
		section()
		if err := runKafka(ctx, p.dsn, *p.kafka, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.pgx != nil {
		section()
		if err := runPgx(ctx, p.dsn, *p.pgx, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.http != nil {
		section()
		if err := runHTTP(ctx, p.dsn, *p.http, args, stdout, stderr); err != nil {
			return err
		}
	}
	if g := p.growth; g != nil {
		section()
		if err := runGrowth(ctx, p.dsn, g.sizes, g.batch, g.workers, g.rounds, g.cell, g.svg, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.cleanup != nil {
		section()
		if err := runCleanup(ctx, p.dsn, *p.cleanup, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.partitions != nil {
		section()
		if err := runPartitions(ctx, p.dsn, *p.partitions, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.outbox != nil {
		section()
		if err := runOutbox(ctx, p.dsn, *p.outbox, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.coalesce != nil {
		section()
		if err := runCoalesce(ctx, p.dsn, *p.coalesce, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.adapters != nil {
		section()
		if err := runAdapters(ctx, p.dsn, *p.adapters, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.ordered != nil {
		section()
		if err := runOrdered(ctx, p.dsn, *p.ordered, args, stdout, stderr); err != nil {
			return err
		}
	}
	if p.write != "" {
		return writeSections(p.write, printed.String())
	}
	return nil
}

// parse reads the command line into a plan. The loyalty variants run when
// -loyalty is set or no other mode is; a flag that only a mode not run
// would read is an error.
func parse(args []string, stderr io.Writer) (*plan, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	write := fs.String("write", "", "Markdown file (e.g. BENCHMARKS.md) in which each section the run prints replaces the section of the same heading, or is appended")
	dsn := fs.String("dsn", "", "Postgres DSN (default $IDEMPOTENT_POSTGRES_DSN, else "+localDSN+")")
	drivers := fs.String("drivers", "pq,pgx", "comma-separated drivers: pq or pgx, each optionally +param=value[&param=value] (e.g. pq+binary_parameters=yes)")
	workers := fs.String("workers", "1,8", "comma-separated numbers of concurrent workers (-growth: the first, unless -growth-workers)")
	var names []string
	for _, v := range loyaltyload.Variants() {
		names = append(names, v.Name)
	}
	variants := fs.String("variants", strings.Join(names, ","), "comma-separated variants")
	rounds := fs.Int("rounds", 3, "rounds, in every mode; every round runs every variant once per driver and worker count")
	cell := fs.Duration("cell", 2*time.Second, "how long each variant (-growth: each table; -pgx: each comparison) runs per round")
	warmup := fs.Duration("warmup", 100*time.Millisecond, "unrecorded run of each variant when a pool is opened")
	customers := fs.Int("customers", 100000, "number of customer balances")
	h2h := fs.String("h2h", "handwritten:process", "pair of variants A:B run at the same time, half the workers each, every round (\"\" for none)")
	sqlLimit := fs.String("sql-limit", "", "path of sql-limit.sh: run it after the rounds and append its pgbench figures")
	loyalty := fs.Bool("loyalty", false, "measure the loyalty variants (the default when no other mode is given)")
	kafkaMode := fs.Bool("kafka", false, "measure the kafka package's consumers against a hand-written franz-go consumer on an in-process kfake cluster (see kafka.go)")
	kafkaRecords := fs.Int("kafka-records", 1000, "with -kafka: records each consumer consumes per cell")
	pgxMode := fs.Bool("pgx", false, "measure the pgx path (idempgx) against hand-written pgx code and the database/sql path (see pgx.go)")
	pgxWorkers := fs.Int("pgx-workers", 8, "with -pgx: concurrent workers")
	pgxAllocs := fs.Int("pgx-allocs", 1000, "with -pgx: calls in a row over which allocations are counted")
	latency := fs.String("latency", "0", "with -pgx or -coalesce: comma-separated one-way delays of a proxy put in front of the server (e.g. 0,1ms; 0 is a direct connection), each measured in turn")
	httpMode := fs.Bool("http", false, "measure the Idempotency-Key middleware (idemhttp, on database/sql and pgx) and its replays against the same handler without it, on a loopback server (see http.go)")
	httpWorkers := fs.Int("http-workers", 8, "with -http: concurrent clients")
	growth := fs.String("growth", "", "comma-separated claim table sizes (e.g. 1000000,10000000): measure Process on a table of each size against an empty one (see growth.go)")
	growthBatch := fs.Int("growth-batch", 1, "with -growth: messages per transaction (more than 1 measures ProcessMessages instead of Process)")
	growthSVG := fs.String("growth-svg", "", "with -growth: write the chart of the ratios to this SVG file")
	growthWorkers := fs.Int("growth-workers", 0, "with -growth: concurrent workers (default: the first of -workers)")
	cleanup := fs.Int("cleanup", 0, "expired claims (e.g. 1000000): measure Cleanup of them, beside a tenth as many live ones (see retention.go)")
	partitions := fs.Int("partitions", 0, "claims of a big day (e.g. 1000000): measure MaintainPartitions dropping days of this many and of a hundredth as many claims, -rounds of each (see retention.go)")
	outboxMode := fs.Bool("outbox", false, "measure the outbox relay's throughput and delay from commit to call against a local no-op provider (see outbox.go)")
	outboxRows := fs.Int("outbox-rows", 10000, "with -outbox: pending rows each throughput run relays")
	outboxMessages := fs.Int("outbox-messages", 400, "with -outbox: messages enqueued at 100 a second for the delay")
	coalesceMode := fs.Bool("coalesce", false, "measure ProcessMessage with and without WithCoalescing across -latency and -hot (see coalesce.go)")
	coalesceWorkers := fs.String("coalesce-workers", "8,32", "with -coalesce: comma-separated numbers of concurrent workers")
	coalesceLimit := fs.String("coalesce-limit", "", "with -coalesce: path of coalesce-limit.sh: run it on each network after its rounds, with as many clients as -coalesce-conns, and report the targets against its ratios")
	coalesceConns := fs.Int("coalesce-conns", 0, "with -coalesce: connections of the pool every variant shares (default: one per worker)")
	hot := fs.String("hot", "0", "with -coalesce: comma-separated shares of messages (e.g. 0,0.1) whose customer is one of 5 hot ones")
	adaptersMode := fs.Bool("adapters", false, "measure each adapter's per-message consumer against ProcessMessage with as many workers and the same effect (see adapters.go)")
	adaptersWorkers := fs.Int("adapters-workers", 4, "with -adapters: workers of each consumer")
	adaptersMessages := fs.Int("adapters-messages", 2000, "with -adapters: messages each consumer applies per round")
	adaptersCoalesce := fs.Int("adapters-coalesce", 0, "with -adapters: also run each consumer on a Middleware WithCoalescing of groups of up to this many (0: not)")
	adaptersConns := fs.Int("adapters-conns", 0, "with -adapters-coalesce: run both of each consumer's coalescing cells (per message and coalesced) on a pool of this many connections")
	adaptersOnly := fs.String("adapters-consumers", strings.Join(adapterNames, ","), "with -adapters: comma-separated consumers to run")
	orderedMode := fs.Bool("ordered", false, "measure ordered mode (WithOrdering) in order and parked against ProcessMessage, on lib/pq and pgx, head to head (see ordered.go)")
	orderedMessages := fs.Int("ordered-messages", 300, "with -ordered: messages per variant, driver and round")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for flagName, mode := range map[string]string{"kafka-records": "kafka", "pgx-workers": "pgx", "pgx-allocs": "pgx",
		"http-workers": "http",
		"growth-batch": "growth", "growth-svg": "growth", "growth-workers": "growth",
		"outbox-rows": "outbox", "outbox-messages": "outbox",
		"adapters-workers": "adapters", "adapters-messages": "adapters", "adapters-consumers": "adapters", "adapters-coalesce": "adapters", "adapters-conns": "adapters",
		"ordered-messages": "ordered"} {
		if set[flagName] && !set[mode] {
			return nil, fmt.Errorf("-%s applies to -%s, which is not given", flagName, mode)
		}
	}
	if set["latency"] && !set["pgx"] && !set["coalesce"] {
		return nil, fmt.Errorf("-latency applies to -pgx and -coalesce, neither of which is given")
	}
	if *rounds < 1 {
		return nil, fmt.Errorf("-rounds: %d is not a positive number", *rounds)
	}
	if *cell <= 0 {
		return nil, fmt.Errorf("-cell: %v is not a positive duration", *cell)
	}
	if *warmup < 0 {
		return nil, fmt.Errorf("-warmup: %v is negative", *warmup)
	}
	p := &plan{dsn: firstNonEmpty(*dsn, os.Getenv("IDEMPOTENT_POSTGRES_DSN"), localDSN), write: *write}
	if *kafkaMode {
		if *kafkaRecords < 10 {
			return nil, fmt.Errorf("-kafka-records: %d is fewer than 10", *kafkaRecords)
		}
		p.kafka = &kafkaOptions{rounds: *rounds, records: *kafkaRecords}
	}
	if *pgxMode {
		if *pgxWorkers < 2 || *pgxWorkers > 32 {
			return nil, fmt.Errorf("-pgx-workers: %d is not a number from 2 to 32", *pgxWorkers)
		}
		if *pgxAllocs < 1 {
			return nil, fmt.Errorf("-pgx-allocs: %d is not a positive number", *pgxAllocs)
		}
		lats, err := parseLatencies(*latency)
		if err != nil {
			return nil, err
		}
		p.pgx = &pgxOptions{workers: *pgxWorkers, rounds: *rounds, cell: *cell, warmup: *warmup, latencies: lats, allocOps: *pgxAllocs}
	}
	if *httpMode {
		if *httpWorkers < 1 || *httpWorkers > 32 {
			return nil, fmt.Errorf("-http-workers: %d is not a number from 1 to 32", *httpWorkers)
		}
		p.http = &httpOptions{workers: *httpWorkers, rounds: *rounds, cell: *cell, warmup: *warmup}
	}
	if *growth != "" {
		g := &growthOptions{batch: *growthBatch, rounds: *rounds, cell: *cell, svg: *growthSVG}
		for _, s := range strings.Split(*growth, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("-growth: %q is not a positive number", s)
			}
			g.sizes = append(g.sizes, n)
		}
		if set["growth-workers"] {
			if *growthWorkers < 1 {
				return nil, fmt.Errorf("-growth-workers: %d is not a positive number", *growthWorkers)
			}
			g.workers = *growthWorkers
		} else {
			w, err := strconv.Atoi(strings.TrimSpace(strings.Split(*workers, ",")[0]))
			if err != nil || w < 1 {
				return nil, fmt.Errorf("-workers: %q does not start with a positive number (-growth uses the first)", *workers)
			}
			g.workers = w
		}
		if g.batch < 1 {
			return nil, fmt.Errorf("-growth-batch: %d is not a positive number", g.batch)
		}
		p.growth = g
	}
	if err := p.parseRetention(set, *cleanup, *partitions, *rounds); err != nil {
		return nil, err
	}
	if err := p.parseOutbox(*outboxMode, *outboxRows, *outboxMessages, *rounds); err != nil {
		return nil, err
	}
	if err := p.parseCoalesce(*coalesceMode, set, *coalesceWorkers, *coalesceConns, *coalesceLimit, *latency, *hot, *rounds, *cell, *warmup); err != nil {
		return nil, err
	}
	if *adaptersMode {
		a, err := parseAdapters(*adaptersWorkers, *adaptersMessages, *adaptersCoalesce, *adaptersConns, *adaptersOnly, *rounds)
		if err != nil {
			return nil, err
		}
		p.adapters = a
	}
	if *orderedMode {
		if *orderedMessages < 10 {
			return nil, fmt.Errorf("-ordered-messages: %d is fewer than 10", *orderedMessages)
		}
		p.ordered = &orderedOptions{rounds: *rounds, messages: *orderedMessages}
	}
	if !*loyalty && (p.ordered != nil || p.kafka != nil || p.pgx != nil || p.http != nil || p.growth != nil || p.cleanup != nil || p.partitions != nil || p.outbox != nil || p.coalesce != nil || p.adapters != nil) {
		for _, f := range []string{"drivers", "variants", "customers", "h2h", "sql-limit"} {
			if set[f] {
				return nil, fmt.Errorf("-%s applies to the loyalty variants, which do not run: add -loyalty", f)
			}
		}
		if set["workers"] && (p.growth == nil || set["growth-workers"]) {
			return nil, fmt.Errorf("-workers applies to the loyalty variants and -growth, which do not run (-pgx has -pgx-workers, -http -http-workers)")
		}
		return p, nil
	}
	o := &options{dsn: p.dsn, rounds: *rounds, cell: *cell, warmup: *warmup, customers: *customers, sqlLimit: *sqlLimit}
	for _, s := range strings.Split(*drivers, ",") {
		c, err := parseDriver(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("-drivers: %w", err)
		}
		o.drivers = append(o.drivers, c)
	}
	for _, s := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 32 {
			return nil, fmt.Errorf("-workers: %q is not a number from 1 to 32", s)
		}
		o.workers = append(o.workers, n)
	}
	for _, s := range strings.Split(*variants, ",") {
		v, ok := lookupVariant(strings.TrimSpace(s))
		if !ok {
			return nil, fmt.Errorf("-variants: unknown variant %q (known: %s)", s, strings.Join(names, ", "))
		}
		o.variants = append(o.variants, v)
	}
	if *h2h != "" {
		a, b, ok := strings.Cut(*h2h, ":")
		va, oka := lookupVariant(a)
		vb, okb := lookupVariant(b)
		if !ok || !oka || !okb || a == b {
			return nil, fmt.Errorf("-h2h: %q is not two different variants A:B (known: %s)", *h2h, strings.Join(names, ", "))
		}
		o.h2h = []loyaltyload.Variant{va, vb}
	}
	if o.customers < 1 {
		return nil, fmt.Errorf("-customers: %d is not a positive number", o.customers)
	}
	p.loyalty = o
	return p, nil
}

// tailWriter passes writes on and remembers the last two bytes written.
type tailWriter struct {
	w    io.Writer
	n    int64
	tail [2]byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	t.n += int64(n)
	for _, c := range p[:n] {
		t.tail = [2]byte{t.tail[1], c}
	}
	return n, err
}

// lookupVariant returns the named variant.
func lookupVariant(name string) (loyaltyload.Variant, bool) {
	for _, v := range loyaltyload.Variants() {
		if v.Name == name {
			return v, true
		}
	}
	return loyaltyload.Variant{}, false
}

// commandLine returns the command that ran, as the reports print it.
func commandLine(args []string) string {
	cmd := "go run ./tests/bench"
	if len(args) > 0 {
		cmd += " " + strings.Join(args, " ")
	}
	return cmd
}

// runLine describes a run for the reports: when, how long, Go and
// PostgreSQL versions.
func runLine(started time.Time, took time.Duration, server string) string {
	return fmt.Sprintf("Run %s, %s; %s %s/%s, GOMAXPROCS %d; PostgreSQL %s on the same machine",
		started.UTC().Format("2006-01-02 15:04 MST"), took.Round(time.Second), runtime.Version(), runtime.GOOS, runtime.GOARCH,
		runtime.GOMAXPROCS(0), server)
}

// serverVersion returns the server_version of the database at dsn.
func serverVersion(ctx context.Context, dsn string) (string, error) {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return "", err
	}
	defer db.Close()
	var v string
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "", fmt.Errorf("connect to %s: %w", dsn, err)
	}
	return v, nil
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// group is one driver at one number of workers.
type group struct {
	driver  driverConfig
	workers int
}

// stats is what a variant measured in one group, over all rounds.
type stats struct {
	msgs, calls  int64
	elapsed      time.Duration
	mallocs      uint64
	writes       int64
	errs         int64
	firstErr     error
	lat          []time.Duration
	perRoundRate []float64
}

func (s *stats) rate() float64 { return float64(s.msgs) / s.elapsed.Seconds() }

type results map[group]map[string]*stats

// runEnv describes the run for the report.
type runEnv struct {
	server  string
	started time.Time
	took    time.Duration
}

func measure(ctx context.Context, o options, log io.Writer) (results, runEnv, error) {
	env := runEnv{started: time.Now()}
	admin, err := sql.Open("postgres", o.dsn)
	if err != nil {
		return nil, env, err
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	if err := admin.QueryRowContext(ctx, "SHOW server_version").Scan(&env.server); err != nil {
		return nil, env, fmt.Errorf("connect to %s: %w", o.dsn, err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema, err := loyaltyload.Setup(ctx, admin, "bench_"+hex.EncodeToString(b), o.customers)
	if err != nil {
		return nil, env, err
	}
	defer func() {
		if err := schema.Drop(context.Background(), admin); err != nil {
			fmt.Fprintln(log, "drop schema:", err)
		}
	}()

	var groups []group
	for _, d := range o.drivers {
		for _, w := range o.workers {
			groups = append(groups, group{d, w})
		}
	}
	res := results{}
	for _, g := range groups {
		res[g] = map[string]*stats{}
		for _, v := range o.variants {
			res[g][v.Name] = &stats{}
		}
		if len(o.h2h) == 2 {
			res[g]["h2h:a"], res[g]["h2h:b"] = &stats{}, &stats{}
		}
	}
	var orderIDs atomic.Int64
	lat := make([][]time.Duration, slices.Max(o.workers))
	for i := range lat {
		lat[i] = make([]time.Duration, 0, 1<<16)
	}
	for r := range o.rounds {
		for gi, g := range groups {
			var writes atomic.Int64
			plain, guarded, err := g.driver.open(o.dsn, g.workers, &writes)
			if err != nil {
				return nil, env, err
			}
			e, err := loyaltyload.NewEnv(plain, guarded, schema, g.driver.nativeArrays())
			if err != nil {
				return nil, env, err
			}
			// Each round starts from another variant, and the groups of one
			// round from other ones again.
			order := slices.Clone(o.variants)
			k := (r + gi) % len(order)
			order = append(order[k:], order[:k]...)
			for _, v := range order {
				runCell(ctx, e, schema, []part{{v: v, workers: g.workers}}, o.warmup, &orderIDs, &writes, lat)
			}
			for _, v := range order {
				if err := ctx.Err(); err != nil {
					return nil, env, err
				}
				s := res[g][v.Name]
				runCell(ctx, e, schema, []part{{v: v, workers: g.workers, s: s}}, o.cell, &orderIDs, &writes, lat)
				fmt.Fprintf(log, "round %d/%d  %-40s %2d workers  %-10s %8.0f msgs/s  errors %d\n",
					r+1, o.rounds, g.driver.label(), g.workers, v.Name, s.perRoundRate[len(s.perRoundRate)-1], s.errs)
			}
			// Head to head: half the workers run one variant, half the
			// other, at the same time, so that both see the same machine.
			if len(o.h2h) == 2 && g.workers >= 2 {
				ha, hb := res[g]["h2h:a"], res[g]["h2h:b"]
				runCell(ctx, e, schema, []part{{v: o.h2h[0], workers: g.workers / 2, s: ha},
					{v: o.h2h[1], workers: g.workers / 2, s: hb}}, o.cell, &orderIDs, &writes, lat)
				fmt.Fprintf(log, "round %d/%d  %-40s %2d workers  head to head: %s %.0f, %s %.0f msgs/s\n",
					r+1, o.rounds, g.driver.label(), g.workers, o.h2h[0].Name, ha.perRoundRate[len(ha.perRoundRate)-1],
					o.h2h[1].Name, hb.perRoundRate[len(hb.perRoundRate)-1])
			}
			_ = plain.Close()
			_ = guarded.Close()
		}
	}
	env.took = time.Since(env.started)
	return res, env, nil
}

// part is a share of a cell's workers running one variant, and where its
// figures go (nowhere when s is nil: a warm-up).
type part struct {
	v       loyaltyload.Variant
	workers int
	s       *stats
}

// runCell runs the parts at the same time for d and adds what each
// measured to its stats. Allocations and network writes are attributed only
// when the cell has a single part.
func runCell(ctx context.Context, e *loyaltyload.Env, schema *loyaltyload.Schema, parts []part, d time.Duration,
	orderIDs, writes *atomic.Int64, lat [][]time.Duration) {
	var stop atomic.Bool
	total := 0
	for _, p := range parts {
		total += p.workers
	}
	calls := make([]atomic.Int64, len(parts))
	errs := make([]atomic.Int64, len(parts))
	firstErr := make([]error, len(parts))
	errOnce := make([]sync.Once, len(parts))
	gens := make([]*loyaltyload.Gen, total)
	for i := range gens {
		gens[i] = loyaltyload.NewGen(schema, orderIDs, uint64(time.Now().UnixNano())+uint64(i))
		lat[i] = lat[i][:0]
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	w0 := writes.Load()
	start := time.Now()
	var wg sync.WaitGroup
	w := 0
	for pi, p := range parts {
		for range p.workers {
			i := w
			w++
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, l := gens[i], lat[i]
				for !stop.Load() {
					t := time.Now()
					err := p.v.Run(ctx, e, g)
					l = append(l, time.Since(t))
					calls[pi].Add(1)
					if err != nil {
						errs[pi].Add(1)
						errOnce[pi].Do(func() { firstErr[pi] = err })
					}
				}
				lat[i] = l
			}()
		}
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	w = 0
	for pi, p := range parts {
		s := p.s
		first := w
		w += p.workers
		if s == nil {
			continue
		}
		n := calls[pi].Load()
		msgs := n * int64(p.v.PerCall)
		s.calls += n
		s.msgs += msgs
		s.elapsed += elapsed
		if len(parts) == 1 {
			s.mallocs += after.Mallocs - before.Mallocs
			s.writes += writes.Load() - w0
		}
		s.errs += errs[pi].Load()
		if s.firstErr == nil {
			s.firstErr = firstErr[pi]
		}
		for _, l := range lat[first:w] {
			s.lat = append(s.lat, l...)
		}
		s.perRoundRate = append(s.perRoundRate, float64(msgs)/elapsed.Seconds())
	}
}
