package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/txclaim/idempotent/internal/loyaltyload"
)

// report prints the Markdown report of a run.
func report(w io.Writer, o options, args []string, env runEnv, res results) {
	fmt.Fprintf(w, "# Benchmarks\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; %d round%s of %v per variant, %d customers.\n\n", runLine(env.started, env.took, env.server), o.rounds, plural(o.rounds), o.cell, o.customers)
	fmt.Fprintf(w, "Each message: `UPDATE balances SET points = points + $1 WHERE customer_id = $2` and "+
		"`INSERT INTO point_ledger …`, one transaction per message except (e), which applies a batch's effects with one "+
		"`UPDATE … FROM unnest(…)` and one `INSERT … SELECT * FROM unnest(…)`. "+
		"Latency is per call (one transaction: a message, or a whole batch). Allocations are the whole process's heap "+
		"allocations (driver, database/sql, harness) per message; writes are network writes per message, which for these "+
		"drivers are round trips. ×(a) and ×(b) are throughput ratios to (a) and (b) of the same driver and worker count "+
		"over all rounds; \"×(b) by round\" is the median (lowest–highest) of the ratios of single rounds, a measure of the noise.\n\n")

	var groups []group
	for _, d := range o.drivers {
		for _, n := range o.workers {
			groups = append(groups, group{d, n})
		}
	}
	for _, g := range groups {
		fmt.Fprintf(w, "## %s, %d worker%s\n\n", g.driver.label(), g.workers, plural(g.workers))
		fmt.Fprintln(w, "| variant | msgs/s | p50 ms | p99 ms | allocs/msg | writes/msg | ×(a) | ×(b) | ×(b) by round | errors |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		a, b := res[g]["effect"], res[g]["handwritten"]
		for _, v := range o.variants {
			s := res[g][v.Name]
			p50, p99 := percentile(s.lat, 0.50), percentile(s.lat, 0.99)
			fmt.Fprintf(w, "| %s | %.0f | %.2f | %.2f | %.1f | %.2f | %s | %s | %s | %d |\n",
				v.Label, s.rate(), ms(p50), ms(p99), float64(s.mallocs)/float64(s.msgs), float64(s.writes)/float64(s.msgs),
				ratio(s, a), ratio(s, b), roundRange(s, b), s.errs)
		}
		for _, v := range o.variants {
			if s := res[g][v.Name]; s.firstErr != nil {
				fmt.Fprintf(w, "\nFirst error of %s: `%v`\n", v.Label, s.firstErr)
			}
		}
		fmt.Fprintln(w)
	}
	headToHead(w, o, groups, res)
	targets(w, o, groups, res)
}

// headToHead prints the cells in which half the workers ran one variant of
// the pair and half the other, at the same time.
func headToHead(w io.Writer, o options, groups []group, res results) {
	if len(o.h2h) != 2 {
		return
	}
	va, vb := o.h2h[0], o.h2h[1]
	var rows []string
	for _, g := range groups {
		a, b := res[g]["h2h:a"], res[g]["h2h:b"]
		if a == nil || b == nil || a.msgs == 0 {
			continue
		}
		rows = append(rows, fmt.Sprintf("| %s | %d + %d | %.0f | %.0f | %.2f | %.2f | %.2f | %s | %d |",
			g.driver.label(), g.workers/2, g.workers/2, a.rate(), b.rate(), ms(percentile(a.lat, 0.5)), ms(percentile(b.lat, 0.5)),
			b.rate()/a.rate(), roundRange(b, a), a.errs+b.errs))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## Head to head: %s and %s at the same time\n\n", va.Label, vb.Label)
	fmt.Fprintf(w, "Each round also runs a cell in which half the workers run %s and the other half %s, on the same database "+
		"at the same time, so that both see the same machine: the ratio of their rates is the difference between them with the "+
		"noise of a shared machine cancelled.\n\n", va.Label, vb.Label)
	fmt.Fprintf(w, "| driver | workers | %[1]s msgs/s | %[2]s msgs/s | %[1]s p50 ms | %[2]s p50 ms | %[2]s/%[1]s | by round | errors |\n", short(va), short(vb))
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	fmt.Fprintln(w)
}

// variantNamed returns the variant of o with that name.
func variantNamed(o options, name string) loyaltyload.Variant {
	for _, v := range o.variants {
		if v.Name == name {
			return v
		}
	}
	return loyaltyload.Variant{Label: name}
}

// short returns a variant's letter, such as "(c)".
func short(v loyaltyload.Variant) string {
	l, _, _ := strings.Cut(v.Label, " ")
	return l
}

// targets prints the ratios the library aims at, for each group that has
// the variants involved.
func targets(w io.Writer, o options, groups []group, res results) {
	fmt.Fprintln(w, "## Targets")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | driver, workers | measured | by round | met |")
	fmt.Fprintln(w, "|---|---|---:|---:|---|")
	row := func(name string, g group, val float64, unit, byRound string, ok bool) {
		met := "yes"
		if !ok {
			met = "**no**"
		}
		fmt.Fprintf(w, "| %s | %s, %d | %.2f%s | %s | %s |\n", name, g.driver.label(), g.workers, val, unit, byRound, met)
	}
	for _, g := range groups {
		r := res[g]
		get := func(n string) *stats { return r[n] }
		if c, b := get("process"), get("handwritten"); c != nil && b != nil && g.workers >= 8 {
			v := c.rate() / b.rate()
			row("(c)/(b) ≥ 0.97, variants in turn", g, v, "", roundRange(c, b), v >= 0.97)
		}
		if c, b := get("h2h:b"), get("h2h:a"); len(o.h2h) == 2 && o.h2h[0].Name == "handwritten" && o.h2h[1].Name == "process" &&
			c != nil && b != nil && b.msgs > 0 && g.workers >= 8 {
			v := c.rate() / b.rate()
			row("(c)/(b) ≥ 0.97, head to head", g, v, "", roundRange(c, b), v >= 0.97)
		}
		if e, c := get("batch100"), get("process"); e != nil && c != nil {
			v := e.rate() / c.rate()
			row("(e, 100)/(c) ≥ 10", g, v, "×", roundRange(e, c), v >= 10)
		}
		if f, c := get("duplicate"), get("process"); f != nil && c != nil {
			v := f.rate() / c.rate()
			row("(f)/(c) ≥ 2", g, v, "×", roundRange(f, c), v >= 2)
		}
		if ev, c := get("event"), get("process"); ev != nil && c != nil && ev.msgs > 0 && c.msgs > 0 {
			v := float64(ev.writes)/float64(ev.msgs) - float64(c.writes)/float64(c.msgs)
			row("writes/msg (c\") − (c) = 0 (the horizon costs no round trip)", g, v, "", "–", v < 0.01)
		}
		for _, t := range []struct {
			name string
			want float64
		}{{"coalesce4", 2.2}, {"coalesce8", 2.2}, {"coalesce4sp", 1.4}, {"coalesce8sp", 1.4}} {
			if co, c := get(t.name), get("process"); co != nil && c != nil && c.msgs > 0 && g.workers >= 8 {
				v := co.rate() / c.rate()
				row(fmt.Sprintf("%s/(c) ≥ %.1f (%s)", short(variantNamed(o, t.name)), t.want, t.name), g, v, "×", roundRange(co, c), v >= t.want)
			}
		}
		if c, b := get("process"), get("handwritten"); c != nil && b != nil {
			v := float64(c.mallocs)/float64(c.msgs) - float64(b.mallocs)/float64(b.msgs)
			row("allocs/msg (c) − (b) ≤ 4", g, v, "", "–", v <= 4)
		}
	}
	fmt.Fprintln(w)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func percentile(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ratio(s, base *stats) string {
	if base == nil || base.msgs == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", s.rate()/base.rate())
}

// roundRange returns the median, lowest and highest ratio of s to base in
// single rounds.
func roundRange(s, base *stats) string {
	if base == nil || len(base.perRoundRate) != len(s.perRoundRate) || len(s.perRoundRate) == 0 {
		return "–"
	}
	r := make([]float64, len(s.perRoundRate))
	for i := range r {
		r[i] = s.perRoundRate[i] / base.perRoundRate[i]
	}
	slices.Sort(r)
	med := r[len(r)/2]
	if len(r)%2 == 0 {
		med = (r[len(r)/2-1] + r[len(r)/2]) / 2
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", med, r[0], r[len(r)-1])
}
