package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
)

func TestNewConsumerRefusesBadInput(t *testing.T) {
	db, err := sql.Open("postgres", "postgres://127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "c")
	if err != nil {
		t.Fatal(err)
	}
	parted, err := idempotent.New(db, postgres.New(), "c", idempotent.WithDailyPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	ordered, err := idempotent.New(db, postgres.New(), "c", idempotent.WithOrdering(idempotent.Ordering{
		Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return nil }}))
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *sql.Tx, *kgo.Record) error { return nil }
	tests := []struct {
		name string
		mw   *idempotent.Middleware
		h    kafka.Handler
		opts []kafka.Option
		want string
		is   error
	}{
		{"nil middleware", nil, h, nil, "nil Middleware", nil},
		{"nil handler", mw, nil, nil, "nil handler", nil},
		{"nil option", mw, h, []kafka.Option{nil}, "nil option", nil},
		{"nil key", mw, h, []kafka.Option{kafka.WithKey(nil)}, "WithKey", nil},
		{"nil event time", mw, h, []kafka.Option{kafka.WithEventTime(nil)}, "WithEventTime", nil},
		{"two event time sources", mw, h, []kafka.Option{kafka.WithoutEventTime(), kafka.WithTransportEventTime()}, "already set", nil},
		{"workers", mw, h, []kafka.Option{kafka.WithWorkers(0)}, "WithWorkers", nil},
		{"poll records", mw, h, []kafka.Option{kafka.WithMaxPollRecords(0)}, "WithMaxPollRecords", nil},
		{"batch size for a record consumer", mw, h, []kafka.Option{kafka.WithBatchSize(10)}, "WithBatchSize: for NewBatchConsumer only", nil},
		{"retry delay order", mw, h, []kafka.Option{kafka.WithRetryDelay(time.Second, time.Millisecond)}, "WithRetryDelay", nil},
		{"future bound", mw, h, []kafka.Option{kafka.WithFutureBound(0)}, "WithFutureBound", nil},
		{"shutdown", mw, h, []kafka.Option{kafka.WithShutdownTimeout(0)}, "WithShutdownTimeout", nil},
		{"poison", mw, h, []kafka.Option{kafka.WithPoison(nil)}, "WithPoison", nil},
		{"observer", mw, h, []kafka.Option{kafka.WithObserver(nil)}, "WithObserver", nil},
		{"dead letter outbox", mw, h, []kafka.Option{kafka.WithDeadLetter(nil, "dlq")}, "WithDeadLetter", nil},
		{"offsets table", mw, h, []kafka.Option{kafka.WithOffsetsTable("a b")}, "offsets table", nil},
		{"reset position", mw, h, []kafka.Option{kafka.WithResetPosition(kafka.ResetPosition(7))}, "WithResetPosition", nil},
		{"partitioned without an event time", parted, h, []kafka.Option{kafka.WithoutEventTime()}, "WithoutEventTime", adapter.ErrNoProducerEventTime},
		{"partitioned with the record timestamp", parted, h, []kafka.Option{kafka.WithTransportEventTime()}, "record timestamp", adapter.ErrNoProducerEventTime},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kafka.NewConsumer(tt.mw, tt.h, tt.opts...)
			if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.is != nil && !errors.Is(err, tt.is)) {
				t.Fatalf("NewConsumer = %v, %v; want an error naming %q", c, err, tt.want)
			}
		})
	}
	bh := func(context.Context, *sql.Tx, []*kgo.Record) error { return nil }
	for _, n := range []int{0, idempotent.MaxBatchSize + 1} {
		if _, err := kafka.NewBatchConsumer(mw, bh, kafka.WithBatchSize(n)); err == nil || !strings.Contains(err.Error(), "WithBatchSize") {
			t.Errorf("WithBatchSize(%d) = %v, want an error naming it", n, err)
		}
	}
	if _, err := kafka.NewBatchConsumer(mw, bh, kafka.WithBatchSize(1)); err != nil {
		t.Errorf("WithBatchSize(1): %v", err)
	}
	if _, err := kafka.NewConsumer(parted, h, kafka.WithEventTime(kafka.TimeHeader("at"))); err != nil {
		t.Errorf("partitioned with a producer's header: %v", err)
	}
	if _, err := kafka.NewConsumer(ordered, h); err != nil {
		t.Errorf("a Middleware created WithOrdering: %v", err)
	}
	if _, err := kafka.NewBatchConsumer(ordered, bh); err != nil {
		t.Errorf("a Middleware created WithOrdering, in batches: %v", err)
	}
}

func TestRunRefusesMissingGroup(t *testing.T) {
	db, err := sql.Open("postgres", "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "c")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kafka.NewConsumer(mw, func(context.Context, *sql.Tx, *kgo.Record) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Run(ctx, kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("t")); err == nil || !strings.Contains(err.Error(), "ConsumerGroup") {
		t.Errorf("Run without a group = %v", err)
	}
	if err := c.Run(ctx, kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g")); err == nil || !strings.Contains(err.Error(), "ConsumeTopics") {
		t.Errorf("Run without topics = %v", err)
	}
}
