package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/txclaim/idempotent/tests/internal/kafkabench"
)

// kafkaOptions is what -kafka measures.
type kafkaOptions struct {
	rounds  int
	records int
}

// runKafka measures the kafka package's consumers against a hand-written
// franz-go consumer (package kafkabench) and writes a Markdown section to w.
func runKafka(ctx context.Context, dsn string, o kafkaOptions, args []string, w, log io.Writer) error {
	started := time.Now()
	server, err := serverVersion(ctx, dsn)
	if err != nil {
		return err
	}
	res, err := kafkabench.Run(ctx, kafkabench.Config{DSN: dsn, Records: o.records, Rounds: o.rounds, Log: log})
	if err != nil {
		return fmt.Errorf("-kafka: %w", err)
	}
	kafkaReport(w, server, args, started, time.Since(started), res)
	return nil
}

// kafkaReport writes the -kafka section.
func kafkaReport(w io.Writer, server string, args []string, started time.Time, took time.Duration, res *kafkabench.Result) {
	fmt.Fprintf(w, "## Kafka consumer (kafka package)\n\n")
	fmt.Fprintf(w, "Command: `%s`\n\n", commandLine(args))
	fmt.Fprintf(w, "%s; kfake in-process cluster, topic of %d partitions, distinct keys, lib/pq with default synchronous_commit, "+
		"one worker each; each effect one `INSERT`, the batch one `INSERT … SELECT unnest(…)`.\n\n", runLine(started, took, server), kafkabench.Partitions)
	fmt.Fprintf(w, "%d round%s; each round runs the three in turn (%s records each), then a head-to-head cell where the hand-written "+
		"consumer and the per-record consumer consume at the same time, each in its own group, and the ratio of the records each "+
		"applied while both ran (from the moment both had applied a tenth of the topic to the moment either had applied nine tenths) "+
		"is taken. (b) is a hand-written franz-go loop: `Middleware.ProcessMessage` (claim + effect) per record, then a Kafka offset commit "+
		"after each poll. Per record: `kafka.NewConsumer`, the offset advance in each record's transaction. Batch: "+
		"`kafka.NewBatchConsumer`, one transaction per poll and partition (up to 100 records: 600 per poll over %d partitions).\n\n",
		len(res.Rounds), plural(len(res.Rounds)), thousands(res.Records), kafkabench.Partitions)
	fmt.Fprintln(w, "| round | (b) msgs/s | per record msgs/s | batch msgs/s | per record/(b) in turn | per record/(b) head to head | batch/per record |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	var hw, rec, bat, inTurn, h2h, bpr []float64
	for i, r := range res.Rounds {
		hw, rec, bat = append(hw, r.HandwrittenRate()), append(rec, r.RecordRate()), append(bat, r.BatchRate())
		inTurn, h2h, bpr = append(inTurn, r.RecordPerHandwritten()), append(h2h, r.RecordPerHandwrittenH2H()), append(bpr, r.BatchPerRecord())
		fmt.Fprintf(w, "| %d | %s | %s | %s | %.2f | %.3f | %.0f× |\n", i+1, thousands(int(hw[i]+0.5)), thousands(int(rec[i]+0.5)),
			thousands(int(bat[i]+0.5)), inTurn[i], h2h[i], bpr[i])
	}
	fmt.Fprintf(w, "| median | %s | %s | %s | %.2f | **%.3f** | **%.0f×** |\n\n", thousands(int(median(hw)+0.5)), thousands(int(median(rec)+0.5)),
		thousands(int(median(bat)+0.5)), median(inTurn), median(h2h), median(bpr))
	fmt.Fprintln(w, "| target | measured (median of rounds) | met |")
	fmt.Fprintln(w, "|---|---:|---|")
	fmt.Fprintf(w, "| per record within 3%% of (b), head to head | %.3f | %s |\n", median(h2h), met(median(h2h) >= 0.97))
	fmt.Fprintf(w, "| batch ≥ 10× per record | %.0f× | %s |\n\n", median(bpr), met(median(bpr) >= 10))
}

// thousands writes n with a comma every three digits.
func thousands(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
