// Package kafkatests holds the benchmark of the kafka package's consumers
// against a hand-written franz-go consumer (package kafkabench, which the
// bench command shares). The kafka package's own tests are in kafka/.
package kafkatests

import (
	"context"
	"testing"

	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/tests/internal/kafkabench"
)

// BenchmarkConsumers consumes the same topic (6 partitions, distinct keys)
// three ways, one worker each: a hand-written franz-go poll loop running
// each record through Middleware.Process and committing the poll's offsets
// to Kafka after, kafka.NewConsumer (one transaction per record with the
// offset advance in it) and kafka.NewBatchConsumer (one transaction per
// poll and partition, up to 100 records). Each of 3 rounds runs the three
// in turn (1,000 records each) and then a head-to-head cell, hand-written
// and per-record consumers at the same time, so that both see the same
// machine. It reports the rates in turn, the head-to-head ratio and
// batch/record; package kafkabench has the details, and the bench command's
// -kafka mode prints the same figures round by round. Run it with
// -benchtime=1x.
func BenchmarkConsumers(b *testing.B) {
	testenv.OpenPostgres(b, 1) // skips, or fails under CI, when Postgres does not answer
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	for range b.N {
		res, err := kafkabench.Run(context.Background(), kafkabench.Config{DSN: dsn, Records: 1000, Rounds: 3})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.HandwrittenRate(), "handwritten-msgs/s")
		b.ReportMetric(res.RecordRate(), "record-msgs/s")
		b.ReportMetric(res.BatchRate(), "batch-msgs/s")
		b.ReportMetric(res.RecordPerHandwritten(), "record/handwritten")
		b.ReportMetric(res.RecordPerHandwrittenH2H(), "record/handwritten-h2h")
		b.ReportMetric(res.BatchPerRecord(), "batch/record")
	}
}
