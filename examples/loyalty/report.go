package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// creditedT returns the points a run credited, for the audit.
type creditedT = func(context.Context) (int64, error)

// pipedEvery is how often a run's line is printed when the output is not a
// terminal, so that a slow run (a real broker) is not silent.
const pipedEvery = 5 * time.Second

// progressPrinter draws one line per run: redrawn in place on a terminal;
// otherwise printed every pipedEvery while the run lasts and once when it
// ends.
type progressPrinter struct {
	out   io.Writer
	tty   bool
	mu    sync.Mutex
	last  time.Time
	drawn bool
}

func newProgressPrinter(out io.Writer) *progressPrinter {
	tty := false
	if f, ok := out.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressPrinter{out: out, tty: tty, last: time.Now()}
}

func (p *progressPrinter) report(s progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	every := 100 * time.Millisecond
	if !p.tty {
		every = pipedEvery
	}
	if !s.done && time.Since(p.last) < every {
		return
	}
	p.last = time.Now()
	const width = 30
	filled := 0
	if s.total > 0 {
		filled = width * s.settled / s.total
	}
	bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
	crashWord := s.crashWord
	if crashWord == "" {
		crashWord = "crashes"
	}
	line := fmt.Sprintf("  %-21s [%s] %5d/%d settled  deliveries %5d  %s %2d  drops %d  %5.1fs",
		s.name, bar, s.settled, s.total, s.deliveries, crashWord, s.crashes, s.drops, s.elapsed.Seconds())
	if p.tty {
		fmt.Fprint(p.out, "\r"+line)
		p.drawn = true
	} else if !s.done {
		fmt.Fprintln(p.out, line)
	}
	if s.done {
		if !p.tty {
			fmt.Fprint(p.out, line)
		}
		fmt.Fprintln(p.out)
		p.drawn = false
	}
}

// abort ends a half-drawn line.
func (p *progressPrinter) abort() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.out)
		p.drawn = false
	}
}

func printAudit(out io.Writer, rs []result) {
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  %-20s", "audit")
	for _, r := range rs {
		fmt.Fprintf(out, " %22s", r.name)
	}
	fmt.Fprintln(out)
	rows := []struct {
		label string
		val   func(result) int64
	}{
		{"orders", func(r result) int64 { return int64(r.orders) }},
		{"deliveries", func(r result) int64 { return r.deliveries }},
		{"duplicates detected", func(r result) int64 { return r.duplicates }},
		{"points expected", func(r result) int64 { return r.expected }},
		{"points credited", func(r result) int64 { return r.credited }},
		{"excess points", func(r result) int64 { return r.excess() }},
	}
	for _, row := range rows {
		fmt.Fprintf(out, "  %-20s", row.label)
		for _, r := range rs {
			fmt.Fprintf(out, " %22d", row.val(r))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
	for _, r := range rs {
		switch {
		case r.excess() > 0:
			fmt.Fprintf(out, "  %s: %d points credited twice; two deliveries of one order both passed the check before either committed.\n", r.name, r.excess())
		case r.excess() < 0:
			fmt.Fprintf(out, "  %s: %d points missing.\n", r.name, -r.excess())
		default:
			fmt.Fprintf(out, "  %s: every order credited exactly once.\n", r.name)
		}
	}
}
