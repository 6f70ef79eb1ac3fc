package rabbitmq_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/rabbitmq"
)

// TestOrderingRefusedWhereOrderIsNotKept: a Middleware created
// WithOrdering is refused at construction where the consumer keeps no
// per-key order (ordered messages would all be poison there), and taken
// where it does.
func TestOrderingRefusedWhereOrderIsNotKept(t *testing.T) {
	mw := testenv.OrderedMiddleware(t)
	if _, err := rabbitmq.NewBatchConsumer(mw, func(context.Context, *sql.Tx, []*amqp.Delivery) error { return nil }); err == nil || !strings.Contains(err.Error(), "WithOrdering") {
		t.Errorf("NewBatchConsumer: %v, want a refusal naming WithOrdering", err)
	}
	if _, err := rabbitmq.NewConsumer(mw, func(context.Context, *sql.Tx, *amqp.Delivery) error { return nil }); err != nil {
		t.Errorf("NewConsumer: %v", err)
	}
}
