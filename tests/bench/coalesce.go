package main

// The -coalesce mode: ProcessMessage with and without WithCoalescing (the
// loyalty variants (c), (g) and (g')) on direct connections and through
// the latency proxy, on a uniform workload and on a hot-key one, with the
// retries each variant needed.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/loyaltyload"
	"github.com/txclaim/idempotent/tests/internal/latencyproxy"
)

// coalesceVariants are the loyalty variants -coalesce runs: (c), the
// baseline, and every coalesced one.
var coalesceVariants = []string{"process", "coalesce4", "coalesce8", "coalesce16", "coalesce4sp", "coalesce8sp", "coalesce16sp"}

// hotCustomers is how many customers the hot share of -hot falls on.
const hotCustomers = 5

// coalesceCustomers is the number of customer balances of -coalesce, as
// the loyalty variants' default.
const coalesceCustomers = 100000

// coalesceOptions is what -coalesce measures.
type coalesceOptions struct {
	workers      []int
	conns        int             // connections of every setting's pool; 0 is one per worker
	latencies    []time.Duration // one-way delays of the proxy; 0 is none
	hot          []float64       // shares of messages on hotCustomers
	rounds       int
	cell, warmup time.Duration
	limit        string // coalesce-limit.sh, run on each network after its rounds; "" is not
}

// ceilingGroup is the group size -coalesce-limit runs coalesce-limit.sh with.
const ceilingGroup = 16

// ceiling is what coalesce-limit.sh measured on one network: one
// transaction per message, and groups of ceilingGroup with and without a
// savepoint per message, as ratios to the first.
type ceiling struct {
	clients  int
	one      float64 // msgs/s
	sp, nosp float64 // ratios
	output   string
}

// ceiling returns the median of each of the ceiling's figures at network
// l over the rounds, and whether there were any.
func (r *coalesceResult) ceiling(l time.Duration) (ceiling, bool) {
	cs := r.ceilings[l]
	if len(cs) == 0 {
		return ceiling{}, false
	}
	var one, sp, nosp []float64
	for _, c := range cs {
		one, sp, nosp = append(one, c.one), append(sp, c.sp), append(nosp, c.nosp)
	}
	return ceiling{clients: cs[0].clients, one: median(one), sp: median(sp), nosp: median(nosp)}, true
}

// parseCeiling reads coalesce-limit.sh's output.
func parseCeiling(out string, clients int) (ceiling, error) {
	c := ceiling{clients: clients, output: strings.TrimSpace(out)}
	var okOne, okSp, okNosp bool
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "one tx per message") && len(f) >= 6:
			c.one, _ = strconv.ParseFloat(f[4], 64)
			okOne = c.one > 0
		case strings.HasPrefix(line, "group, savepoint per message") && len(f) >= 8:
			c.sp, _ = strconv.ParseFloat(f[len(f)-1], 64)
			okSp = c.sp > 0
		case strings.HasPrefix(line, "group, no savepoints") && len(f) >= 7:
			c.nosp, _ = strconv.ParseFloat(f[len(f)-1], 64)
			okNosp = c.nosp > 0
		}
	}
	if !okOne || !okSp || !okNosp {
		return ceiling{}, fmt.Errorf("-coalesce-limit: cannot read the ceiling from %q", out)
	}
	return c, nil
}

// runCeiling runs coalesce-limit.sh against dsn's server (through the proxy
// when dsn is the proxy's) with groups of ceilingGroup and as many clients
// as conns.
func runCeiling(ctx context.Context, script, dsn string, conns int, log io.Writer) (ceiling, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return ceiling{}, fmt.Errorf("-coalesce-limit: %w", err)
	}
	cmd := exec.CommandContext(ctx, "bash", script, strconv.Itoa(ceilingGroup), strconv.Itoa(conns), "6")
	cmd.Env = append(os.Environ(), "PGHOST="+u.Hostname(), "PGPORT="+u.Port(), "PGUSER="+u.User.Username(),
		"PGDATABASE="+strings.TrimPrefix(u.Path, "/"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, log
	if err := cmd.Run(); err != nil {
		return ceiling{}, fmt.Errorf("-coalesce-limit: %s: %w", script, err)
	}
	return parseCeiling(out.String(), conns)
}

// parseCoalesce reads -coalesce, -coalesce-workers, -latency and -hot.
func (p *plan) parseCoalesce(on bool, set map[string]bool, workers string, conns int, limit, latency, hot string, rounds int, cell, warmup time.Duration) error {
	for _, f := range []string{"coalesce-workers", "coalesce-conns", "coalesce-limit", "hot"} {
		if set[f] && !on {
			return fmt.Errorf("-%s applies to -coalesce, which is not given", f)
		}
	}
	if !on {
		return nil
	}
	if conns < 0 || conns > 64 {
		return fmt.Errorf("-coalesce-conns: %d is not a number from 0 (one per worker) to 64", conns)
	}
	if limit != "" {
		if _, err := os.Stat(limit); err != nil {
			return fmt.Errorf("-coalesce-limit: %w", err)
		}
	}
	o := &coalesceOptions{rounds: rounds, cell: cell, warmup: warmup, conns: conns, limit: limit}
	for _, s := range strings.Split(workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 || n > 256 {
			return fmt.Errorf("-coalesce-workers: %q is not a number from 2 to 256", s)
		}
		o.workers = append(o.workers, n)
	}
	for _, s := range strings.Split(hot, ",") {
		h, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || h < 0 || h > 1 || slices.Contains(o.hot, h) {
			return fmt.Errorf("-hot: %q is not a share from 0 to 1 given once", s)
		}
		o.hot = append(o.hot, h)
	}
	lats, err := parseLatencies(latency)
	if err != nil {
		return err
	}
	o.latencies = lats
	p.coalesce = o
	return nil
}

// poolSize is the number of connections of a setting with n workers.
func (o coalesceOptions) poolSize(n int) int {
	if o.conns == 0 {
		return n
	}
	return o.conns
}

// ceilingClients is the number of pgbench clients of -coalesce-limit: the
// pool's connections, 8 when the pool has one per worker.
func (o coalesceOptions) ceilingClients() int {
	if o.conns == 0 {
		return 8
	}
	return o.conns
}

// coalesceKey is one setting of -coalesce: a network, a number of workers
// and a hot share.
type coalesceKey struct {
	latency time.Duration
	workers int
	hot     float64
}

// coalesceResult is what -coalesce measured: per setting and variant, the
// cells' stats and the retries the variant's Middleware reported.
type coalesceResult struct {
	stats    map[coalesceKey]map[string]*stats
	retries  map[coalesceKey]map[string]int64
	rtt      map[time.Duration]time.Duration
	ceilings map[time.Duration][]ceiling // by network, one per round, with -coalesce-limit
}

func newCoalesceResult() *coalesceResult {
	return &coalesceResult{stats: map[coalesceKey]map[string]*stats{}, retries: map[coalesceKey]map[string]int64{},
		rtt: map[time.Duration]time.Duration{}, ceilings: map[time.Duration][]ceiling{}}
}

// at returns the stats of the variant at k, made empty on first use.
func (r *coalesceResult) at(k coalesceKey, variant string) *stats {
	if r.stats[k] == nil {
		r.stats[k], r.retries[k] = map[string]*stats{}, map[string]int64{}
	}
	s := r.stats[k][variant]
	if s == nil {
		s = &stats{}
		r.stats[k][variant] = s
	}
	return s
}

// runCoalesce runs -coalesce and prints its section.
func runCoalesce(ctx context.Context, dsn string, o coalesceOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	server, err := serverVersion(ctx, dsn)
	if err != nil {
		return err
	}
	admin, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema, err := loyaltyload.Setup(ctx, admin, "bench_"+hex.EncodeToString(b), coalesceCustomers)
	if err != nil {
		return err
	}
	defer func() {
		if err := schema.Drop(context.Background(), admin); err != nil {
			fmt.Fprintln(log, "drop schema:", err)
		}
	}()
	schema.HotCustomers = hotCustomers
	var variants []loyaltyload.Variant
	for _, name := range coalesceVariants {
		v, _ := lookupVariant(name)
		variants = append(variants, v)
	}
	pq, _ := parseDriver("pq")
	res := newCoalesceResult()
	var orderIDs atomic.Int64
	lat := make([][]time.Duration, slices.Max(o.workers))
	for i := range lat {
		lat[i] = make([]time.Duration, 0, 1<<16)
	}
	for _, l := range o.latencies {
		target := dsn
		if l > 0 {
			d, p, err := latencyproxy.DSN(dsn, l)
			if err != nil {
				return fmt.Errorf("-latency: %w", err)
			}
			defer p.Close()
			target = d
		}
		if res.rtt[l], err = latencyproxy.RoundTrip(ctx, target); err != nil {
			return fmt.Errorf("-coalesce: %w", err)
		}
		for r := range o.rounds {
			for wi, n := range o.workers {
				var writes atomic.Int64
				plain, guarded, err := pq.open(target, o.poolSize(n), &writes)
				if err != nil {
					return err
				}
				counts := &idempotent.Counts{}
				e, err := loyaltyload.NewEnv(plain, guarded, schema, false, idempotent.WithObserver(counts))
				if err != nil {
					return err
				}
				for hi, h := range o.hot {
					schema.Hot = h
					order := slices.Clone(variants)
					k := (r + wi + hi) % len(order)
					order = append(order[k:], order[:k]...)
					for _, v := range order {
						runCell(ctx, e, schema, []part{{v: v, workers: n}}, o.warmup, &orderIDs, &writes, lat)
					}
					key := coalesceKey{l, n, h}
					for _, v := range order {
						if err := ctx.Err(); err != nil {
							return err
						}
						s := res.at(key, v.Name)
						before := counts.Retries()
						runCell(ctx, e, schema, []part{{v: v, workers: n, s: s}}, o.cell, &orderIDs, &writes, lat)
						res.retries[key][v.Name] += counts.Retries() - before
						fmt.Fprintf(log, "round %d/%d  latency %-6v %2d workers  hot %.2f  %-12s %8.0f msgs/s  retries %d  errors %d\n",
							r+1, o.rounds, l, n, h, v.Name, s.perRoundRate[len(s.perRoundRate)-1], res.retries[key][v.Name], s.errs)
					}
				}
				_ = plain.Close()
				_ = guarded.Close()
			}
			if o.limit != "" {
				fmt.Fprintf(log, "round %d/%d  running %s through %s\n", r+1, o.rounds, o.limit, target)
				c, err := runCeiling(ctx, o.limit, target, o.ceilingClients(), log)
				if err != nil {
					return err
				}
				res.ceilings[l] = append(res.ceilings[l], c)
			}
		}
	}
	coalesceReport(w, server, args, o, started, time.Since(started), res)
	return nil
}

// coalesceReport prints the -coalesce section.
func coalesceReport(w io.Writer, server string, args []string, o coalesceOptions, started time.Time, took time.Duration, res *coalesceResult) {
	fmt.Fprintf(w, "## Coalesced transactions across latency and hot keys\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	pool := "a pool of one connection per worker"
	if o.conns > 0 {
		pool = fmt.Sprintf("a pool of %d connections shared by every worker of a setting", o.conns)
	}
	fmt.Fprintf(w, "%s; lib/pq, %s; %d round%s of %v per variant and setting, %d customers.\n\n",
		runLine(started, took, server), pool, o.rounds, plural(o.rounds), o.cell, coalesceCustomers)
	fmt.Fprintf(w, "The loyalty workload's (c) `ProcessMessage` and its coalesced variants (g) and (g'), each worker calling "+
		"`ProcessMessage` once per message. The proxy delays each direction by the given time, as a network with that "+
		"one-way latency would (rtt is the median SELECT 1 through it); hot is the share of messages whose customer is "+
		"one of %d, the others drawn from all %d. Latency is per call. ×(c) is the throughput ratio to (c) of the same "+
		"setting over all rounds, \"by round\" the median (lowest–highest) of single rounds. Retries/msg are the "+
		"retries the Middleware's observer counted (a coalesced group's retry counts once) per message applied.\n\n",
		hotCustomers, coalesceCustomers)
	fmt.Fprintln(w, "| network | workers | hot | variant | msgs/s | p50 ms | p99 ms | ×(c) | ×(c) by round | retries/msg | errors |")
	fmt.Fprintln(w, "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	type best struct {
		key     coalesceKey
		g, gsp  float64
		gn, gsn string
	}
	var bests []best
	var firstErrs []string
	for _, l := range o.latencies {
		network := (&pgxSetting{latency: l, rtt: res.rtt[l]}).label()
		for _, n := range o.workers {
			for _, h := range o.hot {
				k := coalesceKey{l, n, h}
				base := res.stats[k]["process"]
				bst := best{key: k}
				for _, name := range coalesceVariants {
					s := res.stats[k][name]
					if s == nil {
						continue
					}
					v, _ := lookupVariant(name)
					retries := "–"
					if s.msgs > 0 {
						retries = fmt.Sprintf("%.4f", float64(res.retries[k][name])/float64(s.msgs))
					}
					fmt.Fprintf(w, "| %s | %d | %s | %s | %.0f | %.2f | %.2f | %s | %s | %s | %d |\n",
						network, n, hotLabel(h), v.Label, s.rate(), ms(percentile(s.lat, 0.50)), ms(percentile(s.lat, 0.99)),
						ratio(s, base), roundRange(s, base), retries, s.errs)
					if s.firstErr != nil {
						firstErrs = append(firstErrs, fmt.Sprintf("%s, %d workers, hot %s, %s: `%v`", network, n, hotLabel(h), name, s.firstErr))
					}
					if name == "process" || base == nil || base.msgs == 0 {
						continue
					}
					r := s.rate() / base.rate()
					if strings.HasSuffix(name, "sp") {
						if r > bst.gsp {
							bst.gsp, bst.gsn = r, name
						}
					} else if r > bst.g {
						bst.g, bst.gn = r, name
					}
				}
				bests = append(bests, bst)
			}
		}
	}
	for _, e := range firstErrs {
		fmt.Fprintf(w, "\nFirst error of %s\n", e)
	}
	if len(res.ceilings) > 0 {
		fmt.Fprintf(w, "\n### The ceiling\n\n`%s %d %d 6` after each round of each network, through the same proxy: the same "+
			"statements in pgbench (no Go), one transaction per message against groups of %d with and without a savepoint per "+
			"message; the median of the rounds, and each round's ratios.\n\n", o.limit, ceilingGroup, o.ceilingClients(), ceilingGroup)
		fmt.Fprintln(w, "| network | clients | one tx per message, msgs/s | groups with savepoints | groups without | by round (with / without) |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---|")
		for _, l := range o.latencies {
			c, ok := res.ceiling(l)
			if !ok {
				continue
			}
			var rs []string
			for _, r := range res.ceilings[l] {
				rs = append(rs, fmt.Sprintf("%.2f / %.2f", r.sp, r.nosp))
			}
			fmt.Fprintf(w, "| %s | %d | %.0f | %.2f× | %.2f× | %s |\n", (&pgxSetting{latency: l, rtt: res.rtt[l]}).label(), c.clients, c.one, c.sp, c.nosp, strings.Join(rs, ", "))
		}
	}
	fmt.Fprintln(w, "\n### Targets\n\nThe best (g) and the best (g') of each setting against (c): ≥ 2.2× optimistic and ≥ 1.4× with savepoints "+
		"on a uniform workload, ≥ 1.3× with hot keys; and, where the ceiling was measured, ≥ 0.8 of the ceiling's own ratio "+
		"(÷ ceiling is the best ratio over the ceiling's ratio of the same design on the same network).")
	fmt.Fprintln(w, "\n| network | workers | hot | best (g) ×(c) | met | ÷ ceiling | met | best (g') ×(c) | met | ÷ ceiling | met |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---:|---|---:|---|---:|---|")
	for _, b := range bests {
		tg, tsp := 2.2, 1.4
		if b.key.hot > 0 {
			tg, tsp = 1.3, 1.3
		}
		cg, csp, cgm, cspm := "–", "–", "–", "–"
		if c, ok := res.ceiling(b.key.latency); ok && b.key.hot == 0 {
			cg, cgm = fmt.Sprintf("%.2f", b.g/c.nosp), met(b.g/c.nosp >= 0.8)
			csp, cspm = fmt.Sprintf("%.2f", b.gsp/c.sp), met(b.gsp/c.sp >= 0.8)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %.3f (%s) | %s | %s | %s | %.3f (%s) | %s | %s | %s |\n",
			(&pgxSetting{latency: b.key.latency, rtt: res.rtt[b.key.latency]}).label(), b.key.workers, hotLabel(b.key.hot),
			b.g, b.gn, met(b.g >= tg), cg, cgm, b.gsp, b.gsn, met(b.gsp >= tsp), csp, cspm)
	}
}

// hotLabel is the report's name of a hot share.
func hotLabel(h float64) string {
	if h == 0 {
		return "none"
	}
	return fmt.Sprintf("%.0f%% on %d", 100*h, hotCustomers)
}
