package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// growthShape is a key shape: how the fill writes row g's key (an SQL
// expression of g and of the row's time t) and how a measured message's key
// is made.
type growthShape struct {
	name, label string
	fill        string
	key         func(n int64) string
}

// growthSeqBase is where the measured sequential keys start: above every
// row a fill writes, so that they land at the index's right edge and never
// meet a later fill's rows.
const growthSeqBase = 50_000_000_000

var growthShapes = []growthShape{
	{"uuid4", "random UUIDv4", "gen_random_uuid()::text", func(int64) string { return growthUUID4() }},
	{"uuid7", "time-ordered UUIDv7", `overlay(gen_random_uuid()::text placing substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' from 1 for 15)`,
		func(int64) string { return growthUUID7(time.Now()) }},
	{"sequential", "sequential (zero-padded)", "'order:' || lpad(g::text, 12, '0')", func(n int64) string { return fmt.Sprintf("order:%012d", n) }},
}

// growthCell is one measured point: a key shape and table kind at a claim
// table size, with the full/empty ratio of every round.
type growthCell struct {
	shape       growthShape
	partitioned bool
	rows        int
	full, empty []float64 // msgs/s per round
	ratios      []float64
	size        string // table + indexes on disk
}

// runGrowth measures Process (database/sql, lib/pq) on a claim table filled
// to each of sizes against an empty claim table, in interleaved rounds, for
// every key shape, plain and partitioned. It writes a Markdown table to w
// and, when svgPath is set, an SVG chart of the ratios.
func runGrowth(ctx context.Context, dsn string, sizes []int, batch, workers, rounds int, cell time.Duration, svgPath string, args []string, w, log io.Writer) error {
	slices.Sort(sizes)
	started := time.Now()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(workers + 1)
	db.SetMaxIdleConns(workers + 1)
	var server string
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&server); err != nil {
		return fmt.Errorf("connect to %s: %w", dsn, err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "growth_" + hex.EncodeToString(b)
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer func() {
		if _, err := db.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			fmt.Fprintln(log, "drop schema:", err)
		}
	}()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+schema+".effects (id bigserial PRIMARY KEY, k text NOT NULL)"); err != nil {
		return err
	}
	var tables []*growthTable
	for _, partitioned := range []bool{false, true} {
		for _, shape := range growthShapes {
			t, err := newGrowthTable(ctx, db, schema, shape, partitioned, batch)
			if err != nil {
				return err
			}
			tables = append(tables, t)
		}
	}
	var cells []*growthCell
	filled := 0
	for _, n := range sizes {
		// Fill every table at the same time (each on a connection of its
		// own), then measure them one by one.
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, len(tables))
		for i, t := range tables {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				if errs[i] = growthFill(ctx, db, t, filled, n); errs[i] == nil {
					fmt.Fprintf(log, "%-11s %-10s %9d claims written in %v\n", t.kind(), t.shape.name, n, time.Since(t0).Round(time.Second))
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		filled = n
		fmt.Fprintf(log, "all tables filled to %d claims in %v\n", n, time.Since(start).Round(time.Second))
		for _, t := range tables {
			c, err := t.measure(ctx, db, n, workers, rounds, cell, log)
			if err != nil {
				return err
			}
			cells = append(cells, c)
		}
	}
	growthReport(w, server, args, sizes, batch, workers, rounds, cell, time.Since(started), cells)
	if svgPath != "" {
		svg := growthSVG(sizes, cells)
		if batch > 1 {
			svg = growthSVGTitled(sizes, cells, fmt.Sprintf("ProcessMessages (%d per batch) on a full claim table ÷ on an empty one", batch))
		}
		if err := os.WriteFile(svgPath, svg, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(log, "wrote %s\n", svgPath)
	}
	return nil
}

// growthTable is a claim table filled step by step and the empty table of
// the same kind it is measured against.
type growthTable struct {
	shape         growthShape
	partitioned   bool
	schema        string
	full, empty   string
	mFull, mEmpty *idempotent.Middleware
	seq           atomic.Int64
	batch         int // messages per call: 1 is Process, more ProcessMessages
}

func (t *growthTable) kind() string {
	if t.partitioned {
		return "partitioned"
	}
	return "plain"
}

func newGrowthTable(ctx context.Context, db *sql.DB, schema string, shape growthShape, partitioned bool, batch int) (*growthTable, error) {
	t := &growthTable{shape: shape, partitioned: partitioned, schema: schema, batch: batch}
	t.full = "full_" + shape.name + "_" + t.kind()[:4]
	t.empty = "empty_" + shape.name + "_" + t.kind()[:4]
	t.seq.Store(growthSeqBase)
	var opts []idempotent.Option
	if partitioned {
		opts = append(opts, idempotent.WithDailyPartitions(1))
	}
	var err error
	if t.mFull, err = idempotent.New(db, postgres.New(), "loyalty", append(opts, idempotent.WithTable(schema+"."+t.full))...); err != nil {
		return nil, err
	}
	if t.mEmpty, err = idempotent.New(db, postgres.New(), "loyalty", append(opts, idempotent.WithTable(schema+"."+t.empty))...); err != nil {
		return nil, err
	}
	for _, m := range []*idempotent.Middleware{t.mFull, t.mEmpty} {
		if err := m.EnsureSchema(ctx); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// op returns one delivery on m: Process (ProcessMessage with the event time
// now, when partitioned) with one INSERT as the effect.
func (t *growthTable) op(ctx context.Context, m *idempotent.Middleware) func() error {
	if t.batch > 1 {
		return func() error {
			msgs := make([]idempotent.Message, t.batch)
			now := time.Now()
			for i := range msgs {
				msgs[i] = idempotent.Message{Key: t.shape.key(t.seq.Add(1))}
				if t.partitioned {
					msgs[i].EventTime = now
				}
			}
			_, err := m.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
				keys := make([]string, len(fresh))
				for i, j := range fresh {
					keys[i] = msgs[j].Key
				}
				_, err := tx.ExecContext(ctx, "INSERT INTO "+t.schema+".effects (k) SELECT unnest($1::text[])", pq.Array(keys))
				return err
			})
			return err
		}
	}
	return func() error {
		k := t.shape.key(t.seq.Add(1))
		fn := func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO "+t.schema+".effects (k) VALUES ($1)", k)
			return err
		}
		var err error
		if t.partitioned {
			_, err = m.ProcessMessage(ctx, idempotent.Message{Key: k, EventTime: time.Now()}, fn)
		} else {
			_, err = m.ProcessMessage(ctx, idempotent.Message{Key: k}, fn)
		}
		return err
	}
}

// measure runs rounds of the full and the empty table side by side.
func (t *growthTable) measure(ctx context.Context, db *sql.DB, rows, workers, rounds int, cell time.Duration, log io.Writer) (*growthCell, error) {
	c := &growthCell{shape: t.shape, partitioned: t.partitioned, rows: rows}
	_ = db.QueryRowContext(ctx, `SELECT pg_size_pretty(pg_total_relation_size(c.oid) + coalesce((SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = c.oid), 0))
FROM pg_class c WHERE c.oid = $1::regclass`, t.schema+"."+t.full).Scan(&c.size)
	full, empty := t.op(ctx, t.mFull), t.op(ctx, t.mEmpty)
	if _, _, err := growthPairRun(ctx, full, empty, workers, cell/3); err != nil { // warm-up
		return c, err
	}
	for r := range rounds {
		f, e, err := growthPairRun(ctx, full, empty, workers, cell)
		if err != nil {
			return c, err
		}
		f, e = f*float64(t.batch), e*float64(t.batch) // messages, not calls
		c.full, c.empty, c.ratios = append(c.full, f), append(c.empty, e), append(c.ratios, f/e)
		fmt.Fprintf(log, "%-11s %-10s %9d  round %d/%d  full %6.0f  empty %6.0f msgs/s  ratio %.3f\n",
			t.kind(), t.shape.name, rows, r+1, rounds, f, e, f/e)
	}
	return c, nil
}

// growthFill adds rows from+1 … to to the table. It drops the table's
// indexes, inserts with one INSERT … SELECT FROM generate_series and builds
// the indexes again (far faster than inserting into them row by row), then
// vacuums and analyzes. Row g's time spreads over the last 29 days at any
// fill level (a golden-ratio sequence), so a partitioned table holds claims
// in every day of its retention window.
func growthFill(ctx context.Context, db *sql.DB, gt *growthTable, from, to int) error {
	m, schema, table, shape, partitioned := gt.mFull, gt.schema, gt.full, gt.shape, gt.partitioned
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	q := schema + "." + table
	cols, pk := "consumer, message_key, processed_at", "consumer, message_key"
	day := ""
	if partitioned {
		cols, pk, day = "consumer, message_key, event_day, processed_at", "consumer, message_key, event_day", "(t AT TIME ZONE 'UTC')::date, "
	}
	stmts := []string{
		"SET maintenance_work_mem = '256MB'",
		"ALTER TABLE " + q + " DROP CONSTRAINT " + table + "_pkey",
		"DROP INDEX IF EXISTS " + schema + "." + postgres.IndexName(table),
		fmt.Sprintf(`INSERT INTO %s (%s)
SELECT 'loyalty', %s, %st
FROM (SELECT g, t, lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') AS h
      FROM (SELECT g, now() - (29 * 86400 * (x - floor(x))) * interval '1 second' AS t
            FROM (SELECT g, g * 0.6180339887498949::float8 AS x FROM generate_series(%d, %d) g) a) b) c`,
			q, cols, shape.fill, day, from+1, to),
		"ALTER TABLE " + q + " ADD PRIMARY KEY (" + pk + ")",
	}
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%.60s…: %w", s, err)
		}
	}
	if err := m.EnsureSchema(ctx); err != nil { // the processed_at index of a plain table
		return err
	}
	_, err = conn.ExecContext(ctx, "VACUUM ANALYZE "+q)
	return err
}

// growthPairRun runs full and empty on workers goroutines for d, each
// goroutine alternating between them operation by operation, so that both
// see the same machine at the same moment. It returns the rate of each: its
// operations per second of the time spent in it.
func growthPairRun(ctx context.Context, full, empty func() error, workers int, d time.Duration) (float64, float64, error) {
	var stop atomic.Bool
	var n, spent [2]atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	ops := [2]func() error{full, empty}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; !stop.Load() && ctx.Err() == nil; i++ {
				j := i % 2
				t0 := time.Now()
				if err := ops[j](); err != nil {
					once.Do(func() { firstErr = err; stop.Store(true) })
					return
				}
				spent[j].Add(int64(time.Since(t0)))
				n[j].Add(1)
			}
		}()
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	rate := func(j int) float64 {
		// Per worker: operations per second spent in them; times workers.
		return float64(n[j].Load()) / time.Duration(spent[j].Load()).Seconds() * float64(workers)
	}
	return rate(0), rate(1), firstErr
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func growthRows(n int) string {
	if e := math.Log10(float64(n)); e == math.Trunc(e) {
		sup := map[rune]string{'0': "⁰", '1': "¹", '2': "²", '3': "³", '4': "⁴", '5': "⁵", '6': "⁶", '7': "⁷", '8': "⁸", '9': "⁹"}
		var b strings.Builder
		b.WriteString("10")
		for _, r := range fmt.Sprint(int(e)) {
			b.WriteString(sup[r])
		}
		return b.String()
	}
	return fmt.Sprint(n)
}

func growthReport(w io.Writer, server string, args []string, sizes []int, batch, workers, rounds int, cell, took time.Duration, cells []*growthCell) {
	fmt.Fprintf(w, "## Claim table growth per key shape, plain and partitioned\n\n")
	fmt.Fprintf(w, "Command: `go run ./tests/bench %s` (Postgres %s, lib/pq, %d workers each alternating between the full and the empty table operation by operation, %d round%s of %v, %v in all)\n\n",
		strings.Join(args, " "), server, workers, rounds, plural(rounds), cell, took.Round(time.Second))
	what := "`ProcessMessage` (claim + one INSERT effect)"
	if batch > 1 {
		what = fmt.Sprintf("`ProcessMessages`, %d messages per transaction (claims + one INSERT of the fresh ones; msgs/s counts messages)", batch)
	}
	fmt.Fprintln(w, what+" on a claim table holding N claims, as a ratio to the same on an empty table of the same kind at the same time: median of the rounds' ratios [lowest–highest]. The fill drops the table's indexes, inserts with one INSERT … SELECT FROM generate_series and builds the indexes again; claim times spread over the last 29 days (a partitioned table holds claims in every day of its retention window, and a new claim lands in today's partition).")
	fmt.Fprintln(w)
	fmt.Fprint(w, "| Key shape | table |")
	for _, n := range sizes {
		fmt.Fprintf(w, " %s claims | |", growthRows(n))
	}
	fmt.Fprint(w, "\n|---|---|")
	for range sizes {
		fmt.Fprint(w, "---|---|")
	}
	fmt.Fprint(w, "\n| | |")
	for range sizes {
		fmt.Fprint(w, " full/empty | msgs/s full, empty; size |")
	}
	fmt.Fprintln(w)
	for _, partitioned := range []bool{false, true} {
		for _, shape := range growthShapes {
			kind := "plain"
			if partitioned {
				kind = "partitioned (30 days)"
			}
			fmt.Fprintf(w, "| %s | %s |", shape.label, kind)
			for _, n := range sizes {
				c := findCell(cells, shape.name, partitioned, n)
				if c == nil || len(c.ratios) == 0 {
					fmt.Fprint(w, " — | |")
					continue
				}
				fmt.Fprintf(w, " **%.2f×** [%.2f–%.2f] | %.0f, %.0f; %s |", median(c.ratios), slices.Min(c.ratios), slices.Max(c.ratios),
					median(c.full), median(c.empty), c.size)
			}
			fmt.Fprintln(w)
		}
	}
}

func findCell(cells []*growthCell, shape string, partitioned bool, rows int) *growthCell {
	for _, c := range cells {
		if c.shape.name == shape && c.partitioned == partitioned && c.rows == rows {
			return c
		}
	}
	return nil
}

// growthSVG draws the ratio against the claim table's size (log scale), a
// line per key shape and table kind, the rounds' range as a bar.
func growthSVG(sizes []int, cells []*growthCell) []byte {
	return growthSVGTitled(sizes, cells, "ProcessMessage on a full claim table ÷ on an empty one (8 workers)")
}

func growthSVGTitled(sizes []int, cells []*growthCell, title string) []byte {
	const W, H, left, right, top, bottom = 720, 420, 70, 230, 40, 60
	lo, hi := 1.0, 1.0
	for _, c := range cells {
		if len(c.ratios) > 0 {
			lo, hi = min(lo, slices.Min(c.ratios)), max(hi, slices.Max(c.ratios))
		}
	}
	lo, hi = math.Floor(lo*10-0.5)/10, math.Ceil(hi*10+0.5)/10
	xmin, xmax := math.Log10(float64(sizes[0]))-0.5, math.Log10(float64(sizes[len(sizes)-1]))+0.5
	x := func(n int) float64 {
		return left + (math.Log10(float64(n))-xmin)/(xmax-xmin)*float64(W-left-right)
	}
	y := func(r float64) float64 { return top + (hi-r)/(hi-lo)*float64(H-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", left, title)
	for r := lo; r <= hi+1e-9; r += 0.1 {
		stroke := "#ddd"
		if math.Abs(r-1) < 1e-9 {
			stroke = "#888"
		}
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/><text x="%d" y="%.1f" text-anchor="end">%.1f×</text>`+"\n",
			left, W-right, y(r), y(r), stroke, left-6, y(r)+4, r)
	}
	for _, n := range sizes {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x(n), x(n), top, H-bottom, x(n), H-bottom+18, growthRows(n))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">claims in the table (log scale)</text>`+"\n", (left+W-right)/2, H-bottom+40)
	colors := map[string]string{"uuid4": "#d62728", "uuid7": "#1f77b4", "sequential": "#2ca02c"}
	ly := top + 10
	for _, partitioned := range []bool{false, true} {
		for si, shape := range growthShapes {
			dash, kind := "", "plain"
			if partitioned {
				dash, kind = ` stroke-dasharray="6 4"`, "partitioned"
			}
			// Nudge the lines apart so that the bars do not hide each other.
			dx := float64(si-1)*5 + map[bool]float64{false: -2, true: 2}[partitioned]
			var pts []string
			for _, n := range sizes {
				c := findCell(cells, shape.name, partitioned, n)
				if c == nil || len(c.ratios) == 0 {
					continue
				}
				px := x(n) + dx
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, y(median(c.ratios))))
				fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5"/>`+"\n",
					px, px, y(slices.Min(c.ratios)), y(slices.Max(c.ratios)), colors[shape.name])
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", px, y(median(c.ratios)), colors[shape.name])
			}
			if len(pts) > 1 {
				fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), colors[shape.name], dash)
			}
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d">%s, %s</text>`+"\n",
				W-right+15, W-right+45, ly, ly, colors[shape.name], dash, W-right+52, ly+4, shape.name, kind)
			ly += 20
		}
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">dot: median of rounds</text>`+"\n", W-right+15, ly+10)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">bar: lowest–highest round</text>`+"\n", W-right+15, ly+26)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

func growthUUID4() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return growthFormat(u)
}

func growthUUID7(t time.Time) string {
	var u [16]byte
	_, _ = rand.Read(u[6:])
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	u[6] = u[6]&0x0f | 0x70
	u[8] = u[8]&0x3f | 0x80
	return growthFormat(u)
}

func growthFormat(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
