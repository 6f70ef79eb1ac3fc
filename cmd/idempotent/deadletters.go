package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/outbox"
)

const deadLettersUsage = `Usage: idempotent dead-letters list|show|replay|discard [flags]

  list     the dead letters kafka, redisstream and cdkpubsub wrote through the outbox, a page at a time
  show     one dead letter: why it died, its key, event time, headers, payload, and what was done to it
  replay   send the selected dead letters back to their source with their original key and event time
  discard  delete the selected dead letters from the outbox

replay and discard record who did what in the audit table (created if missing) and need -by and a
filter. Run "idempotent dead-letters list -h" (and show, replay, discard) for the flags.
`

func cmdDeadLetters(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		return usageError{"want list, show, replay or discard"}
	}
	switch args[0] {
	case "list":
		return deadLettersList(ctx, args[1:], e)
	case "show":
		return deadLettersShow(ctx, args[1:], e)
	case "replay", "discard":
		return deadLettersAct(ctx, args[0], args[1:], e)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(e.stdout, deadLettersUsage)
		return helpShown{}
	}
	return usageError{fmt.Sprintf("unknown subcommand %q (want list, show, replay or discard)", args[0])}
}

// deadLetterCommand is a dead-letters subcommand: its -table is the outbox
// table.
type deadLetterCommand struct {
	*command
	audit, kinds string
	filter       deadletter.Filter
	from, before string
	ids          string
}

func newDeadLetterCommand(name, summary string, e env, filter bool) *deadLetterCommand {
	c := &deadLetterCommand{command: newCommand("dead-letters "+name, summary, e, true)}
	t := c.fs.Lookup("table")
	t.Usage, t.DefValue = `outbox table, "table" or "schema.table"`, outbox.DefaultTable
	c.table = outbox.DefaultTable
	c.fs.StringVar(&c.audit, "audit-table", "", `audit table of replays and discards (default: the outbox table's name + "_dead_letter_audit")`)
	c.fs.StringVar(&c.kinds, "kinds", strings.Join(deadletter.DefaultKinds, ","), "the outbox kinds that are dead letters, comma-separated (add cdkpubsub's WithDeadLetter kind)")
	if filter {
		c.fs.StringVar(&c.filter.Consumer, "consumer", "", "only the dead letters of this consumer")
		c.fs.StringVar(&c.filter.Topic, "topic", "", "only those from this Kafka topic or Redis stream")
		c.fs.StringVar(&c.filter.Key, "key", "", "only the one with this key (topic/partition/offset, stream/group/id, or the Go CDK message's key)")
		c.fs.StringVar(&c.filter.Reason, "reason", "", "only those whose reason contains this text")
		c.fs.StringVar(&c.from, "from", "", "only those dead-lettered at or after this time (RFC 3339, or a date: 2026-11-30)")
		c.fs.StringVar(&c.before, "before", "", "only those dead-lettered before this time")
		c.fs.StringVar(&c.ids, "ids", "", "only these outbox row ids, comma-separated (each must be a dead letter)")
	}
	return c
}

// parseTime reads a -from or -before value.
func parseTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, time.DateOnly} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, usageError{fmt.Sprintf("-%s %q: want an RFC 3339 time (2026-11-30T12:00:00Z) or a date (2026-11-30)", name, s)}
}

// parseIDs reads the -ids flag.
func parseIDs(name, s string) ([]int64, error) {
	if s == "" {
		return nil, nil
	}
	var ids []int64
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || id <= 0 {
			return nil, usageError{fmt.Sprintf("-%s: %q is not an outbox row id (want positive whole numbers, comma-separated)", name, f)}
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// parse parses args and checks every flag before the network is touched.
func (c *deadLetterCommand) parse(args []string) error {
	if err := c.command.parse(args); err != nil {
		return err
	}
	var err error
	if c.filter.From, err = parseTime("from", c.from); err != nil {
		return err
	}
	if c.filter.Before, err = parseTime("before", c.before); err != nil {
		return err
	}
	if c.filter.IDs, err = parseIDs("ids", c.ids); err != nil {
		return err
	}
	if err := c.filter.Check(); err != nil {
		return usageError{strings.TrimPrefix(err.Error(), "deadletter: ")}
	}
	return nil
}

// connect opens the database, makes the Store (which checks the tables and
// kinds), then pings the database.
func (c *deadLetterCommand) connect(ctx context.Context) (*database, *deadletter.Store, error) {
	if k := c.kindOf(); k != "" && k != kindPostgres {
		return nil, nil, usageError{fmt.Sprintf("dead letters live in the outbox, which is Postgres only: this is a %s database, where no adapter writes any", k)}
	}
	d, err := c.open(false)
	if err != nil {
		return nil, nil, err
	}
	opts := []deadletter.Option{deadletter.WithTable(c.table), deadletter.WithKinds(strings.Split(c.kinds, ",")...)}
	if c.audit != "" {
		opts = append(opts, deadletter.WithAuditTable(c.audit))
	}
	s, err := deadletter.New(d.db, opts...)
	if err != nil {
		_ = d.db.Close()
		return nil, nil, usageError{strings.TrimPrefix(err.Error(), "deadletter: New: ")}
	}
	if err := d.ping(ctx); err != nil {
		_ = d.db.Close()
		return nil, nil, err
	}
	return d, s, nil
}

// when prints a time, or "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// printable shows b as text when it is UTF-8 without control characters,
// else as Go's quoted string.
func printable(b []byte) string {
	s := string(b)
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// oneLineText folds s onto one line of at most n runes.
func oneLineText(s string, n int) string {
	s = oneLine(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func deadLettersList(ctx context.Context, args []string, e env) error {
	c := newDeadLetterCommand("list", "Prints the dead letters of the outbox table that the filter flags select, oldest first, a page\nat a time: id, consumer, kind, source, event time, state and reason. \"-after\" the last id\nprinted gives the next page.", e, true)
	c.fs.Int64Var(&c.filter.After, "after", 0, "print the dead letters after this id (the next page)")
	c.fs.IntVar(&c.filter.Limit, "limit", deadletter.DefaultPage, fmt.Sprintf("dead letters per page, 1 to %d", deadletter.MaxPage))
	if err := c.parse(args); err != nil {
		return err
	}
	if err := positive("limit", c.filter.Limit, 1); err != nil {
		return err
	}
	d, s, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer d.db.Close()
	dls, next, err := s.List(ctx, c.filter)
	if err != nil {
		return d.clean(err)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tCONSUMER\tKIND\tSOURCE\tEVENT TIME\tSTATE\tREASON")
	for _, dl := range dls {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", dl.ID, dl.Consumer, dl.Kind, oneLineText(dl.Source, 60), when(dl.EventTime), dl.State, oneLineText(dl.Reason, 80))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if next != 0 {
		fmt.Fprintf(e.stdout, "%d dead letters shown of %s; more after: -after %d\n", len(dls), s.Table(), next)
		return nil
	}
	fmt.Fprintf(e.stdout, "%d dead letters in %s\n", len(dls), s.Table())
	return nil
}

func deadLettersShow(ctx context.Context, args []string, e env) error {
	c := newDeadLetterCommand("show", "Prints one dead letter: why it died, where it came from, its key, event time, headers and\npayload, and every replay and discard recorded for it.", e, false)
	id := c.fs.Int64("id", 0, "the dead letter's outbox row id (required)")
	if err := c.parse(args); err != nil {
		return err
	}
	if *id <= 0 {
		return usageError{fmt.Sprintf("-id is %d, want the outbox row id of a dead letter (idempotent dead-letters list prints them)", *id)}
	}
	d, s, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer d.db.Close()
	dl, hist, err := s.Show(ctx, *id)
	if errors.Is(err, deadletter.ErrNoAuditTable) {
		err = nil // nothing was ever replayed or discarded
	}
	if err != nil {
		return d.clean(err)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	for _, f := range [][2]string{
		{"id", strconv.FormatInt(dl.ID, 10)},
		{"consumer", dl.Consumer},
		{"kind", dl.Kind},
		{"key", dl.Key},
		{"source", dl.Source},
		{"dead-letter destination", dl.Destination},
		{"reason", oneLine(dl.Reason)},
		{"event time", when(dl.EventTime)},
		{"dead-lettered", when(dl.DeadLetteredAt)},
		{"state", fmt.Sprintf("%s (relay attempts %d)", dl.State, dl.Attempts)},
	} {
		fmt.Fprintf(w, "%s\t%s\n", f[0], f[1])
	}
	if dl.Deliveries > 0 {
		fmt.Fprintf(w, "deliveries\t%d (before it was dead-lettered)\n", dl.Deliveries)
	}
	if dl.LastError != "" {
		fmt.Fprintf(w, "relay error\t%s\n", oneLine(dl.LastError))
	}
	if dl.RecordKey != nil {
		fmt.Fprintf(w, "record key\t%s\n", printable(dl.RecordKey))
	}
	for _, h := range dl.Headers {
		fmt.Fprintf(w, "header\t%s: %s\n", h.Key, printable([]byte(h.Value)))
	}
	if dl.Payload != nil {
		fmt.Fprintf(w, "payload\t%s\n", printable(dl.Payload))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, a := range hist {
		fmt.Fprintf(e.stdout, "%s by %s at %s%s\n", a.Action, a.Actor, when(a.At), replayOf(a))
	}
	if len(hist) == 0 {
		fmt.Fprintln(e.stdout, "never replayed or discarded")
	}
	return nil
}

// replayOf says which outbox row a replay became.
func replayOf(a deadletter.Action) string {
	if a.Action != "replay" {
		return ""
	}
	return fmt.Sprintf(" (outbox kind %s, idempotency key %s)", a.ReplayKind, a.ReplayKey)
}

func deadLettersAct(ctx context.Context, name string, args []string, e env) error {
	summary := map[string]string{
		"replay":  "Sends the dead letters the filter flags select back to their source: each becomes an outbox\nrow of kind KIND-replay, holding the original key, headers, payload and event time, that a\nRelay with the transport's replay sender (kafka.ReplaySender, redisstream.ReplaySender)\nproduces. A message applied since answers Duplicate; one never applied is applied once.\nEach replay is recorded in the audit table with -by, in the same transaction.",
		"discard": "Deletes the dead letters the filter flags select from the outbox, and records each, with -by\nand its reason, in the audit table, in the same transaction.",
	}[name]
	c := newDeadLetterCommand(name, summary, e, true)
	by := c.fs.String("by", "", "who does it, recorded in the audit table (required)")
	dryRun := c.fs.Bool("dry-run", false, "print what would be done, change nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	if c.filter.Empty() {
		return usageError{fmt.Sprintf("no filter: %s acts on the dead letters a filter selects (-ids, -key, -consumer, -topic, -reason, -from, -before); it never takes them all by default", name)}
	}
	if strings.TrimSpace(*by) == "" && !*dryRun {
		return usageError{"-by is required: who " + name + "s, recorded in the audit table"}
	}
	d, s, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer d.db.Close()
	if *dryRun {
		f, n := c.filter, 0
		for {
			f.Limit = deadletter.MaxPage
			dls, next, err := s.List(ctx, f)
			if err != nil {
				return d.clean(err)
			}
			for _, dl := range dls {
				fmt.Fprintf(e.stdout, "would %s %d (consumer %s, %s, %s)\n", name, dl.ID, dl.Consumer, dl.Kind, dl.Source)
			}
			n += len(dls)
			if next == 0 {
				break
			}
			f.After = next
		}
		fmt.Fprintf(e.stdout, "%d dead letters would be %s; nothing changed\n", n, map[string]string{"replay": "replayed", "discard": "discarded"}[name])
		return nil
	}
	if err := s.EnsureSchema(ctx); err != nil {
		return d.clean(err)
	}
	act := s.Replay
	if name == "discard" {
		act = s.Discard
	}
	done, err := act(ctx, c.filter, *by)
	if errors.Is(err, deadletter.ErrNotFound) {
		return errors.New(strings.TrimPrefix(d.clean(err).Error(), "deadletter: "))
	}
	if err != nil {
		return d.clean(err)
	}
	for _, a := range done {
		fmt.Fprintf(e.stdout, "%s %d by %s%s\n", map[string]string{"replay": "replayed", "discard": "discarded"}[name], a.DeadLetterID, a.Actor, replayOf(a))
	}
	fmt.Fprintf(e.stdout, "%d dead letters %s, recorded in %s\n", len(done), map[string]string{"replay": "replayed", "discard": "discarded"}[name], s.AuditTable())
	return nil
}
