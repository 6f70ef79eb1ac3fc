package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

const orderUsage = `Usage: idempotent order gaps|skip [flags]

  gaps  the entities whose messages wait in the parking table (WithOrdering), with the missing
        sequences and how long the oldest has waited
  skip  CONSUMER KEY SEQ: mark the missing sequences of one entity up to SEQ as skipped; the
        consumer's next CheckGaps applies the parked messages that follow, in order

Run "idempotent order gaps -h" (and skip) for the flags.
`

func cmdOrder(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		return usageError{"want gaps or skip"}
	}
	switch args[0] {
	case "gaps":
		return orderGaps(ctx, args[1:], e)
	case "skip":
		return orderSkip(ctx, args[1:], e)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(e.stdout, orderUsage)
		return helpShown{}
	}
	return usageError{fmt.Sprintf("unknown subcommand %q (want gaps or skip)", args[0])}
}

// parseWithArgs parses flags given before, between or after the command's
// positional arguments, and returns those.
func (c *command) parseWithArgs(args []string) ([]string, error) {
	var pos []string
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.help()
				return nil, helpShown{}
			}
			return nil, usageError{err.Error()}
		}
		if c.fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, c.fs.Arg(0))
		args = c.fs.Args()[1:]
	}
}

// orderTableNames returns the quoted sequence and parking tables of claim
// table t in d's database.
func orderTableNames(d *database, t dialect.Table) (seq, parked string, err error) {
	o, ok := d.target.dialect.(dialect.Orderer)
	if !ok {
		return "", "", fmt.Errorf("the %s dialect keeps no order", d.target.kind)
	}
	s, p := o.OrderTables(t)
	quote := pq.QuoteIdentifier
	switch d.target.kind {
	case kindMySQL:
		quote = mysqlQuote
	case kindSQLite:
		quote = func(s string) string { return `"` + s + `"` }
	}
	return s.Quoted(quote), p.Quoted(quote), nil
}

// orderTablesExist reports whether the parking table of claim table t
// exists.
func orderTablesExist(ctx context.Context, d *database, t dialect.Table) (bool, error) {
	_, p := d.target.dialect.(dialect.Orderer).OrderTables(t)
	lay, err := d.layout(ctx, p)
	return lay.exists, err
}

func orderGaps(ctx context.Context, args []string, e env) error {
	c := newCommand("order gaps", "Lists every entity of an ordered consumer (WithOrdering) with messages in the parking table:\nthe last sequence applied, the lowest parked, how many are parked and how long the oldest has\nwaited. A gap (missing sequences) stays until the missing message arrives, an operator runs\nidempotent order skip, or the consumer's gap policy dead-letters it. An entity whose next\nsequence is parked is applied by the consumer's next CheckGaps.", e, true)
	consumer := c.fs.String("consumer", "", "only this consumer's entities (default: every consumer with parked messages)")
	older := &days{}
	c.fs.Var(older, "older", "only those whose oldest parked message waited at least this long (the consumer's gap timeout: 15m by default)")
	if err := c.parse(args); err != nil {
		return err
	}
	if err := checkDuration("older", older.d, true); err != nil {
		return err
	}
	d, tab, err := c.claimTableFor(ctx, *consumer)
	if err != nil {
		return err
	}
	defer d.db.Close()
	t, _ := dialect.ParseTable(c.table) // checked by claimTableFor
	if _, _, err := orderTableNames(d, t); err != nil {
		return err
	}
	ok, err := orderTablesExist(ctx, d, t)
	if err != nil {
		return d.clean(err)
	}
	if !ok {
		fmt.Fprintf(e.stdout, "%s: no parking table (no consumer of it was created WithOrdering): no gaps\n", c.table)
		return nil
	}
	consumers := []string{*consumer}
	if *consumer == "" {
		if consumers, err = parkedConsumers(ctx, d, t); err != nil {
			return d.clean(err)
		}
	}
	now := time.Now()
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tORDER KEY\tLAST APPLIED\tNEXT PARKED\tPARKED\tWAITING\tSTATE")
	gaps, next := 0, 0
	for _, name := range consumers {
		ws, err := tab.Waiting(ctx, name)
		if err != nil {
			return d.clean(err)
		}
		for _, g := range ws {
			age := now.Sub(g.Since)
			if age < older.d {
				continue
			}
			state := fmt.Sprintf("gap: %s missing", seqRange(g.LastSeq+1, g.NextParked-1))
			if g.NextParked <= g.LastSeq+1 {
				state = "next: applied by the consumer's CheckGaps"
				next++
			} else {
				gaps++
			}
			fmt.Fprintf(w, "%s\t%q\t%d\t%d\t%d\t%s\t%s\n", g.Consumer, g.OrderKey, g.LastSeq, g.NextParked, g.Parked, formatDays(age.Round(time.Second)), state)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%d gaps, %d entities waiting for CheckGaps\n", gaps, next)
	return nil
}

// seqRange prints "5" or "5..7".
func seqRange(from, to int64) string {
	if from == to {
		return strconv.FormatInt(from, 10)
	}
	return fmt.Sprintf("%d..%d", from, to)
}

// parkedConsumers lists the consumers with parked messages in the parking
// table of claim table t.
func parkedConsumers(ctx context.Context, d *database, t dialect.Table) ([]string, error) {
	_, parked, err := orderTableNames(d, t)
	if err != nil {
		return nil, err
	}
	var out []string
	err = query(ctx, d.db, "SELECT DISTINCT consumer FROM "+parked+" WHERE state = 'P' ORDER BY consumer", nil, func(rows *sql.Rows) error {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		out = append(out, s)
		return nil
	})
	return out, err
}

func orderSkip(ctx context.Context, args []string, e env) error {
	c := newCommand("order skip", "Arguments: CONSUMER KEY SEQ (flags may come before or after them).\n\nMarks the missing sequences of ordering key KEY of consumer CONSUMER, from the one after the last\napplied up to SEQ, as skipped, and makes SEQ the last applied, in one transaction. Nothing is\napplied here: the parked messages that follow SEQ without a gap are applied, in order, by the\nconsumer's next CheckGaps. A skipped message that arrives later is refused (ErrSkippedSequence).\nIt refuses to skip a parked sequence, more than "+strconv.Itoa(idempotent.MaxSkip)+" sequences, or an entity the consumer never saw.", e, true)
	pos, err := c.parseWithArgs(args)
	if err != nil {
		return err
	}
	if len(pos) != 3 {
		return usageError{fmt.Sprintf("want CONSUMER KEY SEQ, got %d arguments", len(pos))}
	}
	consumer, key := pos[0], pos[1]
	seq, err := strconv.ParseInt(pos[2], 10, 64)
	if err != nil || seq < 1 {
		return usageError{fmt.Sprintf("SEQ %q is not a sequence number (want a whole number of at least 1)", pos[2])}
	}
	d, tab, err := c.claimTableFor(ctx, consumer)
	if err != nil {
		return err
	}
	defer d.db.Close()
	s, err := tab.SkipGap(ctx, consumer, key, seq)
	if err != nil {
		return d.clean(err)
	}
	fmt.Fprintf(e.stdout, "consumer %s, ordering key %q: skipped %s; the last applied is now %d\n", s.Consumer, s.OrderKey, seqRange(s.From, s.To), s.To)
	switch {
	case s.Next > 0:
		fmt.Fprintf(e.stdout, "%d parked messages (%s) are next: the consumer's next CheckGaps applies them in order", s.Next, seqRange(s.To+1, s.To+int64(s.Next)))
	default:
		fmt.Fprint(e.stdout, "no parked message is next")
	}
	if rest := s.Parked - s.Next; rest > 0 {
		fmt.Fprintf(e.stdout, "; %d more stay parked behind another gap", rest)
	}
	fmt.Fprintln(e.stdout)
	return nil
}

// orderFigures are the ordering tables' figures beside a claim table.
type orderFigures struct {
	seqName, parkedName string
	entities, consumers int64 // sequence rows, and the consumers they belong to
	parked, waiting     int64 // parked messages, and the entities they belong to
	skipped             int64 // tombstones of skipped sequences
}

// readOrderFigures reads the figures of claim table t's ordering tables;
// ok is false when the dialect keeps no order or the tables are missing.
func readOrderFigures(ctx context.Context, d *database, t dialect.Table) (f orderFigures, ok bool, err error) {
	o, isOrderer := d.target.dialect.(dialect.Orderer)
	if !isOrderer {
		return f, false, nil
	}
	if ok, err := orderTablesExist(ctx, d, t); err != nil || !ok {
		return f, false, err
	}
	s, p := o.OrderTables(t)
	f.seqName, f.parkedName = s.String(), p.String()
	seq, parked, err := orderTableNames(d, t)
	if err != nil {
		return f, false, err
	}
	if err := d.db.QueryRowContext(ctx, "SELECT count(*), count(DISTINCT consumer) FROM "+seq).Scan(&f.entities, &f.consumers); err != nil {
		return f, false, err
	}
	err = d.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(CASE WHEN state = 'P' THEN 1 ELSE 0 END), 0), COALESCE(SUM(CASE WHEN state = 'S' THEN 1 ELSE 0 END), 0) FROM "+parked).
		Scan(&f.parked, &f.skipped)
	if err != nil {
		return f, false, err
	}
	err = d.db.QueryRowContext(ctx, "SELECT count(*) FROM (SELECT DISTINCT consumer, order_key FROM "+parked+" WHERE state = 'P') w").Scan(&f.waiting)
	return f, err == nil, err
}

// printOrderFigures prints the stats line of the ordering tables.
func printOrderFigures(w io.Writer, f orderFigures) {
	fmt.Fprintf(w, "ordering\t%s: %d entities of %d consumers; %s: %d parked messages of %d entities, %d skipped sequences (idempotent order gaps)\n",
		f.seqName, f.entities, f.consumers, f.parkedName, f.parked, f.waiting, f.skipped)
}
