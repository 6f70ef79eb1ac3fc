package dialect_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// noUpsert is a dialect without the optional Upserter.
type noUpsert struct{ dialect.Dialect }

func TestNewVersionedUpsertRejectsBadInput(t *testing.T) {
	good := dialect.VersionedUpsert{Table: "order_status", Key: []string{"order_id"}, Version: "version", Columns: []string{"status"}}
	for _, c := range []struct {
		name string
		d    dialect.Dialect
		u    func(u dialect.VersionedUpsert) dialect.VersionedUpsert
		want string
	}{
		{"nil dialect", nil, nil, "nil dialect"},
		{"no Upserter", noUpsert{postgres.New()}, nil, "has no version-guarded upsert"},
		{"bad table", postgres.New(), func(u dialect.VersionedUpsert) dialect.VersionedUpsert { u.Table = "a.b.c"; return u }, "at most one dot"},
		{"no key", postgres.New(), func(u dialect.VersionedUpsert) dialect.VersionedUpsert { u.Key = nil; return u }, "no key columns"},
		{"bad column", postgres.New(), func(u dialect.VersionedUpsert) dialect.VersionedUpsert { u.Columns = []string{"x; DROP"}; return u }, "column"},
		{"column twice", postgres.New(), func(u dialect.VersionedUpsert) dialect.VersionedUpsert { u.Columns = []string{"order_id"}; return u }, `"order_id" is listed twice`},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := good
			if c.u != nil {
				u = c.u(u)
			}
			up, err := dialect.NewVersionedUpsert(c.d, u)
			if up != nil || err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got (%v, %v), want an error containing %q", up, err, c.want)
			}
		})
	}
}

func TestUpsertExec(t *testing.T) {
	up, err := dialect.NewVersionedUpsert(postgres.New(), dialect.VersionedUpsert{Table: "s", Key: []string{"id"}, Version: "v"})
	if err != nil {
		t.Fatal(err)
	}
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := up.Exec(ctx, db, 1); err == nil || !strings.Contains(err.Error(), "1 values, want 2") {
		t.Fatalf("wrong value count: %v", err)
	}
	boom := errors.New("boom")
	mock.ExpectExec(up.SQL()).WithArgs(1, 2).WillReturnError(boom)
	if ok, err := up.Exec(ctx, db, 1, 2); ok || !errors.Is(err, boom) {
		t.Fatalf("failing statement: got (%v, %v)", ok, err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}
