package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/kafkaoffsets"
	"github.com/txclaim/idempotent/migrations"
	"github.com/txclaim/idempotent/postgres"
)

const kafkaOffsetsUsage = `Usage: idempotent kafka-offsets list|reset [flags]

  list   print the stored offsets of the kafka consumer's offsets table
  reset  set one partition's stored offset, deliberately

Run "idempotent kafka-offsets list -h" or "idempotent kafka-offsets reset -h" for the flags.
`

func cmdKafkaOffsets(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		return usageError{"want list or reset"}
	}
	switch args[0] {
	case "list":
		return kafkaOffsetsList(ctx, args[1:], e)
	case "reset":
		return kafkaOffsetsReset(ctx, args[1:], e)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(e.stdout, kafkaOffsetsUsage)
		return helpShown{}
	}
	return usageError{fmt.Sprintf("unknown subcommand %q (want list or reset)", args[0])}
}

// kafkaCommand is a kafka-offsets subcommand: its -table is the offsets
// table.
type kafkaCommand struct {
	*command
	consumer, topic *string
	set             map[string]bool // the flags given on the command line
}

func newKafkaCommand(name, summary string, e env) *kafkaCommand {
	c := newCommand("kafka-offsets "+name, summary, e, true)
	t := c.fs.Lookup("table")
	t.Usage, t.DefValue = `kafka offsets table, "table" or "schema.table"`, migrations.DefaultKafkaOffsetsTable
	c.table = migrations.DefaultKafkaOffsetsTable
	return &kafkaCommand{
		command:  c,
		consumer: c.fs.String("consumer", "", "the consumer: the Middleware's consumer name"),
		topic:    c.fs.String("topic", "", "the Kafka topic"),
	}
}

func (c *kafkaCommand) parse(args []string) error {
	if err := c.command.parse(args); err != nil {
		return err
	}
	c.set = map[string]bool{}
	c.fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	return nil
}

// statements checks the table, consumer and topic flags before the network
// is touched; db is not connected yet.
func (c *kafkaCommand) statements(db *sql.DB) (kafkaoffsets.Statements, error) {
	q, err := kafkaoffsets.New(c.table)
	if err != nil {
		return q, usageError{strings.TrimPrefix(err.Error(), "kafka: ")}
	}
	if *c.consumer != "" {
		// New checks a consumer's name as the consumer's own Middleware
		// does, and sends nothing.
		if _, err := idempotent.New(db, postgres.New(), *c.consumer); err != nil {
			return q, usageError{strings.TrimPrefix(err.Error(), "idempotent: ")}
		}
	}
	if len(*c.topic) > kafkaoffsets.MaxTopicBytes {
		return q, usageError{fmt.Sprintf("-topic is %d bytes, want at most %d", len(*c.topic), kafkaoffsets.MaxTopicBytes)}
	}
	return q, nil
}

// connect opens the database, checks the flags, then pings it.
func (c *kafkaCommand) connect(ctx context.Context) (*database, kafkaoffsets.Statements, error) {
	if k := c.kindOf(); k != "" && k != kindPostgres {
		return nil, kafkaoffsets.Statements{}, usageError{"the kafka consumer's offsets table is Postgres only"}
	}
	d, err := c.open(false)
	if err != nil {
		return nil, kafkaoffsets.Statements{}, err
	}
	q, err := c.statements(d.db)
	if err == nil {
		err = d.ping(ctx)
	}
	if err != nil {
		_ = d.db.Close()
		return nil, q, err
	}
	return d, q, nil
}

func kafkaOffsetsList(ctx context.Context, args []string, e env) error {
	c := newKafkaCommand("list", "Prints the stored offsets of the kafka consumer's offsets table: every row, or those of\n-consumer and -topic.", e)
	if err := c.parse(args); err != nil {
		return err
	}
	d, q, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer d.db.Close()
	rows, err := kafkaoffsets.List(ctx, d.db, q, *c.consumer, *c.topic)
	if err != nil {
		return d.clean(err)
	}
	for _, r := range rows {
		id := r.TopicID
		if id == "" {
			id = "-"
		}
		fmt.Fprintf(e.stdout, "%s  %s  partition %d  next offset %d  topic ID %s  updated %s\n",
			r.Consumer, r.Topic, r.Partition, r.NextOffset, id, r.UpdatedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(e.stdout, "%d stored offsets in %s\n", len(rows), c.table)
	return nil
}

func kafkaOffsetsReset(ctx context.Context, args []string, e env) error {
	c := newKafkaCommand("reset", "Sets the stored offset of one partition of one consumer — the next record it applies — to\n-offset, creating the row if there is none, and forgets the topic ID stored with it. Use it\nafter a partition stopped (its log lost records or was re-created) once you know where\nto go on. Every flag is required. A member that owns the partition goes on from -offset\nat its next record; a stopped partition resumes when it is assigned again (restart the\nmember).", e)
	partition := c.fs.Int64("partition", -1, "the partition (required)")
	offset := c.fs.Int64("offset", -1, "the offset of the next record to apply (required)")
	if err := c.parse(args); err != nil {
		return err
	}
	var missing []string
	for _, f := range []string{"table", "consumer", "topic", "partition", "offset"} {
		if !c.set[f] {
			missing = append(missing, "-"+f)
		}
	}
	if len(missing) > 0 {
		return usageError{fmt.Sprintf("%s required: reset moves a stored position, so every value is given explicitly", strings.Join(missing, ", "))}
	}
	switch {
	case *c.consumer == "":
		return usageError{"-consumer is empty"}
	case *c.topic == "":
		return usageError{"-topic is empty"}
	case *partition < 0 || *partition > math.MaxInt32:
		return usageError{fmt.Sprintf("-partition is %d, want 0 to %d", *partition, math.MaxInt32)}
	case *offset < 0:
		return usageError{fmt.Sprintf("-offset is %d, want 0 or more", *offset)}
	}
	d, q, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer d.db.Close()
	was, existed, err := kafkaoffsets.Reset(ctx, d.db, q, *c.consumer, *c.topic, int32(*partition), *offset)
	if err != nil {
		return d.clean(err)
	}
	before := "had no stored offset"
	if existed {
		id := was.TopicID
		if id == "" {
			id = "none"
		}
		before = fmt.Sprintf("was at %d (topic ID %s)", was.NextOffset, id)
	}
	fmt.Fprintf(e.stdout, "%s: consumer %s, topic %s partition %d %s, now at %d\n", c.table, *c.consumer, *c.topic, *partition, before, *offset)
	return nil
}
