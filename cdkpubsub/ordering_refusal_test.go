package cdkpubsub_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
)

// TestOrderingRefusedWhereOrderIsNotKept: a Middleware created
// WithOrdering is refused at construction where the consumer keeps no
// per-key order (ordered messages would all be poison there), and taken
// where it does.
func TestOrderingRefusedWhereOrderIsNotKept(t *testing.T) {
	mw := testenv.OrderedMiddleware(t)
	if _, err := cdkpubsub.NewBatchConsumer(mw, func(context.Context, *sql.Tx, []*pubsub.Message) error { return nil }); err == nil || !strings.Contains(err.Error(), "WithOrdering") {
		t.Errorf("NewBatchConsumer: %v, want a refusal naming WithOrdering", err)
	}
	if _, err := cdkpubsub.NewConsumer(mw, func(context.Context, *sql.Tx, *pubsub.Message) error { return nil }); err != nil {
		t.Errorf("NewConsumer: %v", err)
	}
}
