package kafka_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
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
	other, err := sql.Open("postgres", "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	h := func(context.Context, *sql.Tx, *kgo.Record) error { return nil }
	tests := []struct {
		name string
		db   *sql.DB
		mw   *idempotent.Middleware
		h    kafka.Handler
		opts []kafka.Option
		want string
	}{
		{"nil db", nil, mw, h, nil, "nil *sql.DB"},
		{"nil middleware", db, nil, h, nil, "nil middleware"},
		{"nil handler", db, mw, nil, nil, "nil handler"},
		{"nil option", db, mw, h, []kafka.Option{nil}, "nil option"},
		{"workers", db, mw, h, []kafka.Option{kafka.WithWorkers(0)}, "WithWorkers"},
		{"poll records", db, mw, h, []kafka.Option{kafka.WithMaxPollRecords(0)}, "WithMaxPollRecords"},
		{"retry delay order", db, mw, h, []kafka.Option{kafka.WithRetryDelay(time.Second, time.Millisecond)}, "WithRetryDelay"},
		{"retry delay bound", db, mw, h, []kafka.Option{kafka.WithRetryDelay(time.Second, time.Hour)}, "WithRetryDelay"},
		{"shutdown", db, mw, h, []kafka.Option{kafka.WithShutdownTimeout(0)}, "WithShutdownTimeout"},
		{"poison", db, mw, h, []kafka.Option{kafka.WithPoison(nil)}, "WithPoison"},
		{"observer", db, mw, h, []kafka.Option{kafka.WithObserver(nil)}, "WithObserver"},
		{"dead letter outbox", db, mw, h, []kafka.Option{kafka.WithDeadLetter(nil, "dlq")}, "WithDeadLetter"},
		{"offsets table", db, mw, h, []kafka.Option{kafka.WithOffsetsTable("a b")}, "offsets table"},
		{"another db than the middleware's", other, mw, h, nil, "db is not the *sql.DB the middleware was created with"},
		{"reset position", db, mw, h, []kafka.Option{kafka.WithResetPosition(kafka.ResetPosition(7))}, "WithResetPosition"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kafka.NewConsumer(tt.db, tt.mw, nil, tt.h, tt.opts...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewConsumer = %v, %v; want an error naming %q", c, err, tt.want)
			}
		})
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
	c, err := kafka.NewConsumer(db, mw, nil, func(context.Context, *sql.Tx, *kgo.Record) error { return nil })
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
