package watermill_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/watermill"
)

// TestOrderingRefusedWhereOrderIsNotKept: a Middleware created
// WithOrdering is refused at construction where the consumer keeps no
// per-key order (ordered messages would all be poison there), and taken
// where it does.
func TestOrderingRefusedWhereOrderIsNotKept(t *testing.T) {
	mw := testenv.OrderedMiddleware(t)
	h := func(context.Context, *sql.Tx, *message.Message) error { return nil }
	txOf := func(context.Context) (*sql.Tx, bool) { return nil, false }
	if _, err := watermill.NewHandler(mw, h, watermill.WithSubscriberTx(txOf)); err == nil || !strings.Contains(err.Error(), "WithOrdering") {
		t.Errorf("NewHandler WithSubscriberTx: %v, want a refusal naming WithOrdering", err)
	}
	if _, err := watermill.NewHandler(mw, h); err != nil {
		t.Errorf("NewHandler: %v", err)
	}
}
