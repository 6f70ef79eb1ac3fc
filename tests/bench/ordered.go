package main

// -ordered: ordered mode (WithOrdering) against ProcessMessage, on lib/pq
// (the database/sql Middleware) and on pgx (idempgx), head to head.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/postgres"
)

// orderedOptions is what -ordered measures.
type orderedOptions struct {
	rounds   int
	messages int // per variant, driver and round
}

// orderedEntities is how many entities the ordered variants spread their
// messages over.
const orderedEntities = 1000

// orderedVariants are the variants of -ordered, in their column order:
// ProcessMessage, an in-order message, and a pair whose second message
// arrives first, parks, and is released by the first (two messages).
var orderedVariants = []string{"process", "ordered", "parked"}

// orderedDriver runs the three variants on one driver: call i of variant v
// sends one message (two for "parked").
type orderedDriver struct {
	name string
	run  map[string]func(ctx context.Context, i int) error
}

// orderedSample is one round's mean microseconds per message, by driver
// and variant.
type orderedSample map[string]map[string]float64

func runOrdered(ctx context.Context, dsn string, o orderedOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	server, err := serverVersion(ctx, dsn)
	if err != nil {
		return err
	}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := "ordbench_" + hex.EncodeToString(b)
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+s); err != nil {
		return fmt.Errorf("-ordered: %w", err)
	}
	defer func() {
		if _, err := db.ExecContext(context.Background(), "DROP SCHEMA "+s+" CASCADE"); err != nil {
			fmt.Fprintln(log, "drop schema:", err)
		}
	}()
	for _, q := range []string{
		"CREATE TABLE " + s + ".balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0)",
		"INSERT INTO " + s + ".balances SELECT g, 0 FROM generate_series(1, 100) g",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("-ordered: %w", err)
		}
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("-ordered: %w", err)
	}
	defer pool.Close()
	drivers, err := orderedDrivers(ctx, db, pool, s)
	if err != nil {
		return fmt.Errorf("-ordered: %w", err)
	}
	// Warm-up: connections, prepared statements, the tables' first pages.
	for _, d := range drivers {
		for _, v := range orderedVariants {
			for i := range 20 {
				if err := d.run[v](ctx, -1-i); err != nil {
					return fmt.Errorf("-ordered: warm-up %s %s: %w", d.name, v, err)
				}
			}
		}
	}
	var samples []orderedSample
	for r := range o.rounds {
		sample, err := orderedRound(ctx, drivers, o.messages, r)
		if err != nil {
			return fmt.Errorf("-ordered: round %d: %w", r+1, err)
		}
		samples = append(samples, sample)
		fmt.Fprintf(log, "ordered round %d/%d:", r+1, o.rounds)
		for _, d := range drivers {
			fmt.Fprintf(log, "  %s in order %.2f×, parked %.2f×", d.name, sample[d.name]["ordered"]/sample[d.name]["process"], sample[d.name]["parked"]/sample[d.name]["process"])
		}
		fmt.Fprintln(log)
	}
	orderedReport(w, server, args, o, started, time.Since(started), []string{drivers[0].name, drivers[1].name}, samples)
	return nil
}

// orderedRound sends, message by message, one call of every variant on
// every driver in turn (the order rotating from call to call), so that the
// drift of a shared machine falls on all of them alike, and returns the
// mean microseconds per message of each.
func orderedRound(ctx context.Context, drivers []orderedDriver, messages, round int) (orderedSample, error) {
	type cell struct{ d, v int }
	var cells []cell
	for d := range drivers {
		for v := range orderedVariants {
			cells = append(cells, cell{d, v})
		}
	}
	took := make([][]time.Duration, len(drivers))
	for d := range took {
		took[d] = make([]time.Duration, len(orderedVariants))
	}
	for i := range messages {
		n := round*messages + i
		for k := range cells {
			c := cells[(k+n)%len(cells)]
			start := time.Now()
			if err := drivers[c.d].run[orderedVariants[c.v]](ctx, n); err != nil {
				return nil, fmt.Errorf("%s %s: %w", drivers[c.d].name, orderedVariants[c.v], err)
			}
			took[c.d][c.v] += time.Since(start)
		}
	}
	out := orderedSample{}
	for d, dr := range drivers {
		out[dr.name] = map[string]float64{}
		for v, name := range orderedVariants {
			per := messages
			if name == "parked" {
				per *= 2
			}
			out[dr.name][name] = float64(took[d][v].Microseconds()) / float64(per)
		}
	}
	return out, nil
}

// orderedDrivers returns lib/pq's and pgx's variants, each on claim tables
// of its own in schema s; the effect is the same UPDATE of one of 100
// balances for every message, released ones included.
func orderedDrivers(ctx context.Context, db *sql.DB, pool *pgxpool.Pool, s string) ([]orderedDriver, error) {
	upd := "UPDATE " + s + ".balances SET points = points + 1 WHERE customer_id = $1"
	sqlEffect := func(i int) idempotent.TxFunc {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, upd, (i%100+100)%100+1)
			return err
		}
	}
	pgxEffect := func(i int) idempgx.Func {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, upd, (i%100+100)%100+1)
			return err
		}
	}
	newSQL := func(table string, opts ...idempotent.Option) (*idempotent.Middleware, error) {
		m, err := idempotent.New(db, postgres.New(), "bench", append([]idempotent.Option{idempotent.WithTable(s + "." + table)}, opts...)...)
		if err != nil {
			return nil, err
		}
		return m, m.EnsureSchema(ctx)
	}
	newPgx := func(table string, opts ...idempgx.Option) (*idempgx.Middleware, error) {
		m, err := idempgx.New(pool, "bench", append([]idempgx.Option{idempgx.WithTable(s + "." + table)}, opts...)...)
		if err != nil {
			return nil, err
		}
		return m, m.EnsureSchema(ctx)
	}
	sqlPlain, err := newSQL("pq_plain")
	if err != nil {
		return nil, err
	}
	sqlOrd, err := newSQL("pq_ordered", idempotent.WithOrdering(idempotent.Ordering{Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
		return sqlEffect(int(p.OrderSeq))(ctx, tx)
	}}))
	if err != nil {
		return nil, err
	}
	pgxPlain, err := newPgx("pgx_plain")
	if err != nil {
		return nil, err
	}
	pgxOrd, err := newPgx("pgx_ordered", idempgx.WithOrdering(idempgx.Ordering{Release: func(ctx context.Context, tx pgx.Tx, p idempotent.ParkedMessage) error {
		return pgxEffect(int(p.OrderSeq))(ctx, tx)
	}}))
	if err != nil {
		return nil, err
	}
	// Call i of "ordered" sends sequence i/orderedEntities+1 of entity
	// i%orderedEntities (warm-up calls, i < 0, entities of their own);
	// call i of "parked" sends sequence 2k+2 of its entity, which parks,
	// then 2k+1, which applies and releases it.
	entity := func(prefix string, i int) (string, int64) {
		if i < 0 {
			return fmt.Sprintf("%s-warm%d", prefix, -i), 1
		}
		return fmt.Sprintf("%s%d", prefix, i%orderedEntities), int64(i/orderedEntities) + 1
	}
	want := func(out, w idempotent.Outcome, err error) error {
		if err == nil && out != w {
			err = fmt.Errorf("outcome %v, want %v", out, w)
		}
		return err
	}
	sqlDriver := orderedDriver{name: "lib/pq", run: map[string]func(context.Context, int) error{
		"process": func(ctx context.Context, i int) error {
			out, err := sqlPlain.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("p%d", i)}, sqlEffect(i))
			return want(out, idempotent.Applied, err)
		},
		"ordered": func(ctx context.Context, i int) error {
			e, q := entity("o", i)
			out, err := sqlOrd.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("o%d", i), OrderKey: e, OrderSeq: q}, sqlEffect(i))
			return want(out, idempotent.Applied, err)
		},
		"parked": func(ctx context.Context, i int) error {
			e, q := entity("r", i)
			late := idempotent.Message{Key: fmt.Sprintf("r%d-b", i), OrderKey: e, OrderSeq: 2 * q, Payload: []byte("{}")}
			out, err := sqlOrd.ProcessMessage(ctx, late, sqlEffect(i))
			if err := want(out, idempotent.Parked, err); err != nil {
				return err
			}
			first := idempotent.Message{Key: fmt.Sprintf("r%d-a", i), OrderKey: e, OrderSeq: 2*q - 1}
			out, err = sqlOrd.ProcessMessage(ctx, first, sqlEffect(i))
			return want(out, idempotent.Applied, err)
		},
	}}
	pgxDriver := orderedDriver{name: "pgx", run: map[string]func(context.Context, int) error{
		"process": func(ctx context.Context, i int) error {
			out, err := pgxPlain.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("p%d", i)}, pgxEffect(i))
			return want(out, idempotent.Applied, err)
		},
		"ordered": func(ctx context.Context, i int) error {
			e, q := entity("o", i)
			out, err := pgxOrd.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("o%d", i), OrderKey: e, OrderSeq: q}, pgxEffect(i))
			return want(out, idempotent.Applied, err)
		},
		"parked": func(ctx context.Context, i int) error {
			e, q := entity("r", i)
			late := idempotent.Message{Key: fmt.Sprintf("r%d-b", i), OrderKey: e, OrderSeq: 2 * q, Payload: []byte("{}")}
			out, err := pgxOrd.ProcessMessage(ctx, late, pgxEffect(i))
			if err := want(out, idempotent.Parked, err); err != nil {
				return err
			}
			first := idempotent.Message{Key: fmt.Sprintf("r%d-a", i), OrderKey: e, OrderSeq: 2*q - 1}
			out, err = pgxOrd.ProcessMessage(ctx, first, pgxEffect(i))
			return want(out, idempotent.Applied, err)
		},
	}}
	return []orderedDriver{sqlDriver, pgxDriver}, nil
}

// orderedReport prints the -ordered section.
func orderedReport(w io.Writer, server string, args []string, o orderedOptions, started time.Time, took time.Duration, drivers []string, samples []orderedSample) {
	fmt.Fprintf(w, "## Ordered per key (WithOrdering) against ProcessMessage, lib/pq and pgx\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; %d round%s of %d messages per variant and driver; one worker. lib/pq is the database/sql Middleware, pgx is "+
		"idempgx's, each on claim tables of its own. Every message's effect is the same `UPDATE` of one of 100 balances. \"in order\": "+
		"the next sequence of one of %d entities; \"parked\": a pair, the second sequence first (it parks), then the first, which "+
		"applies and releases it in its transaction, per message of the pair. Each round sends the six variants call by call, the "+
		"order rotating from call to call, so that the drift of a shared machine falls on all of them alike; a ratio is of one "+
		"round's mean latencies per message, and [min–max] is its spread over the rounds.\n\n",
		runLine(started, took, server), o.rounds, plural(o.rounds), o.messages, orderedEntities)
	fmt.Fprintln(w, "| driver | ProcessMessage µs/msg | in order µs/msg | parked µs/msg | in order × ProcessMessage | parked × ProcessMessage |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	ratios := func(d, v string) []float64 {
		var out []float64
		for _, s := range samples {
			out = append(out, s[d][v]/s[d]["process"])
		}
		return out
	}
	mean := func(d, v string) float64 {
		var xs []float64
		for _, s := range samples {
			xs = append(xs, s[d][v])
		}
		return median(xs)
	}
	spread := func(xs []float64) string {
		return fmt.Sprintf("**%.2f×** [%.2f–%.2f]", median(xs), slices.Min(xs), slices.Max(xs))
	}
	for _, d := range drivers {
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %s | %s |\n", d, mean(d, "process"), mean(d, "ordered"), mean(d, "parked"),
			spread(ratios(d, "ordered")), spread(ratios(d, "parked")))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target (median over the rounds) | "+drivers[0]+" | "+drivers[1]+" |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, t := range []struct {
		label, v string
		max      float64
	}{{"in order ≤ 1.25× ProcessMessage", "ordered", 1.25}, {"parked then released ≤ 2× ProcessMessage", "parked", 2}} {
		fmt.Fprintf(w, "| %s |", t.label)
		for _, d := range drivers {
			m := median(ratios(d, t.v))
			verdict := "yes"
			if m > t.max {
				verdict = "no"
			}
			fmt.Fprintf(w, " %.2f× %s |", m, verdict)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}
