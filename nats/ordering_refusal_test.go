package nats_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/nats"
)

// TestOrderingRefusedWhereOrderIsNotKept: a Middleware created
// WithOrdering is refused at construction where the consumer keeps no
// per-key order (ordered messages would all be poison there), and taken
// where it does.
func TestOrderingRefusedWhereOrderIsNotKept(t *testing.T) {
	mw := testenv.OrderedMiddleware(t)
	if _, err := nats.NewBatchConsumer(mw, func(context.Context, *sql.Tx, []jetstream.Msg) error { return nil }); err == nil || !strings.Contains(err.Error(), "WithOrdering") {
		t.Errorf("NewBatchConsumer: %v, want a refusal naming WithOrdering", err)
	}
	if _, err := nats.NewConsumer(mw, func(context.Context, *sql.Tx, jetstream.Msg) error { return nil }); err != nil {
		t.Errorf("NewConsumer: %v", err)
	}
}
