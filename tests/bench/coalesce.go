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
var coalesceVariants = []string{"process", "coalesce4", "coalesce8", "coalesce4sp", "coalesce8sp"}

// hotCustomers is how many customers the hot share of -hot falls on.
const hotCustomers = 5

// coalesceCustomers is the number of customer balances of -coalesce, as
// the loyalty variants' default.
const coalesceCustomers = 100000

// coalesceOptions is what -coalesce measures.
type coalesceOptions struct {
	workers      []int
	latencies    []time.Duration // one-way delays of the proxy; 0 is none
	hot          []float64       // shares of messages on hotCustomers
	rounds       int
	cell, warmup time.Duration
}

// parseCoalesce reads -coalesce, -coalesce-workers, -latency and -hot.
func (p *plan) parseCoalesce(on bool, set map[string]bool, workers, latency, hot string, rounds int, cell, warmup time.Duration) error {
	for _, f := range []string{"coalesce-workers", "hot"} {
		if set[f] && !on {
			return fmt.Errorf("-%s applies to -coalesce, which is not given", f)
		}
	}
	if !on {
		return nil
	}
	o := &coalesceOptions{rounds: rounds, cell: cell, warmup: warmup}
	for _, s := range strings.Split(workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 || n > 32 {
			return fmt.Errorf("-coalesce-workers: %q is not a number from 2 to 32", s)
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
	stats   map[coalesceKey]map[string]*stats
	retries map[coalesceKey]map[string]int64
	rtt     map[time.Duration]time.Duration
}

func newCoalesceResult() *coalesceResult {
	return &coalesceResult{stats: map[coalesceKey]map[string]*stats{}, retries: map[coalesceKey]map[string]int64{},
		rtt: map[time.Duration]time.Duration{}}
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
				plain, guarded, err := pq.open(target, n, &writes)
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
		}
	}
	coalesceReport(w, server, args, o, started, time.Since(started), res)
	return nil
}

// coalesceReport prints the -coalesce section.
func coalesceReport(w io.Writer, server string, args []string, o coalesceOptions, started time.Time, took time.Duration, res *coalesceResult) {
	fmt.Fprintf(w, "## Coalesced transactions across latency and hot keys\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; lib/pq; %d round%s of %v per variant and setting, %d customers.\n\n",
		runLine(started, took, server), o.rounds, plural(o.rounds), o.cell, coalesceCustomers)
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
	fmt.Fprintln(w, "\n### Targets\n\nThe best (g) and the best (g') of each setting against (c): ≥ 2.2× optimistic and ≥ 1.4× with savepoints on a uniform workload, ≥ 1.3× with hot keys.")
	fmt.Fprintln(w, "\n| network | workers | hot | best (g) ×(c) | met | best (g') ×(c) | met |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---:|---|")
	for _, b := range bests {
		tg, tsp := 2.2, 1.4
		if b.key.hot > 0 {
			tg, tsp = 1.3, 1.3
		}
		fmt.Fprintf(w, "| %s | %d | %s | %.3f (%s) | %s | %.3f (%s) | %s |\n",
			(&pgxSetting{latency: b.key.latency, rtt: res.rtt[b.key.latency]}).label(), b.key.workers, hotLabel(b.key.hot),
			b.g, b.gn, met(b.g >= tg), b.gsp, b.gsn, met(b.gsp >= tsp))
	}
}

// hotLabel is the report's name of a hot share.
func hotLabel(h float64) string {
	if h == 0 {
		return "none"
	}
	return fmt.Sprintf("%.0f%% on %d", 100*h, hotCustomers)
}
