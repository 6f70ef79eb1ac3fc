package testenv

import (
	"context"
	"database/sql"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// OrderedMiddleware returns a Middleware created WithOrdering (its Release
// does nothing) on a mock database that is sent nothing: for the checks an
// adapter runs at construction.
func OrderedMiddleware(t testing.TB) *idempotent.Middleware {
	t.Helper()
	db, _ := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithOrdering(idempotent.Ordering{
		Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return nil }}))
	if err != nil {
		t.Fatal(err)
	}
	return mw
}
