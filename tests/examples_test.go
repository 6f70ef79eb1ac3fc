package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// TestRootExamplesOnPostgres runs the root package's Example scenarios
// (example_test.go, example_batch_test.go), which script the database on
// go-sqlmock, against the real server: the same calls give the same
// outcomes, and the effects land exactly once.
func TestRootExamplesOnPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*sql.DB, *idempotent.Middleware, string) {
		db := openGuarded(t, "pq", 4)
		name := tempSchema(t, db)
		schema := pq.QuoteIdentifier(name)
		if _, err := db.Exec("CREATE TABLE " + schema + ".balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL); " +
			"INSERT INTO " + schema + ".balances VALUES (7, 0), (8, 0)"); err != nil {
			t.Fatal(err)
		}
		mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(name+".processed_messages"))
		if err != nil {
			t.Fatal(err)
		}
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		return db, mw, schema
	}
	points := func(t *testing.T, db *sql.DB, schema string, customer int) int64 {
		t.Helper()
		var p int64
		if err := db.QueryRow("SELECT points FROM "+schema+".balances WHERE customer_id = $1", customer).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("Process", func(t *testing.T) {
		t.Parallel()
		db, mw, schema := setup(t)
		var got []idempotent.Outcome
		for range 2 {
			o, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + $1 WHERE customer_id = $2", 50, 7)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, o)
		}
		if fmt.Sprint(got) != "[applied duplicate]" || points(t, db, schema, 7) != 50 {
			t.Errorf("outcomes %v, points %d; want [applied duplicate], 50", got, points(t, db, schema, 7))
		}
	})

	t.Run("Claim", func(t *testing.T) {
		t.Parallel()
		db, mw, schema := setup(t)
		deliver := func() (bool, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return false, err
			}
			defer tx.Rollback() //nolint:errcheck // a no-op after Commit
			claimed, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "order-completed:9912"})
			if err != nil || !claimed {
				return false, err
			}
			if _, err := tx.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + 50 WHERE customer_id = 7"); err != nil {
				return false, err
			}
			return true, tx.Commit()
		}
		for i, want := range []bool{true, false} {
			if claimed, err := deliver(); err != nil || claimed != want {
				t.Fatalf("delivery %d: (%v, %v), want claimed %v", i+1, claimed, err, want)
			}
		}
		if p := points(t, db, schema, 7); p != 50 {
			t.Errorf("points %d, want 50", p)
		}
	})

	t.Run("GuardConnector", func(t *testing.T) {
		t.Parallel()
		db, mw, schema := setup(t)
		_, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := db.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + 50 WHERE customer_id = 7")
			return err
		})
		if !errors.Is(err, idempotent.ErrAutocommit) {
			t.Errorf("got %v, want ErrAutocommit", err)
		}
		if p := points(t, db, schema, 7); p != 0 {
			t.Errorf("points %d, want 0: the escaped statement committed", p)
		}
	})

	t.Run("WrapMessages", func(t *testing.T) {
		t.Parallel()
		db, mw, schema := setup(t)
		type order struct{ OrderID, CustomerID, Points int64 }
		process := idempotent.WrapMessages(mw,
			func(o order) (idempotent.Message, error) {
				return idempotent.Message{Key: fmt.Sprintf("order-completed:%d", o.OrderID)}, nil
			},
			func(ctx context.Context, tx *sql.Tx, msgs []order) error {
				var customers, pts []int64
				for _, o := range msgs {
					customers, pts = append(customers, o.CustomerID), append(pts, o.Points)
				}
				_, err := tx.ExecContext(ctx, "UPDATE "+schema+".balances b SET points = b.points + u.p "+
					"FROM (SELECT c, sum(p) AS p FROM unnest($1::bigint[], $2::bigint[]) AS u(c, p) GROUP BY c) u WHERE b.customer_id = u.c",
					pq.Array(customers), pq.Array(pts))
				return err
			})
		first := []order{{9912, 7, 50}, {9913, 8, 20}, {9912, 7, 50}}
		for _, c := range []struct {
			batch []order
			want  string
		}{
			{first, "[applied applied duplicate]"},
			{append(first, order{9914, 7, 5}), "[duplicate duplicate duplicate applied]"},
		} {
			got, err := process(ctx, c.batch)
			if err != nil || fmt.Sprint(got) != c.want {
				t.Fatalf("got (%v, %v), want %s", got, err, c.want)
			}
		}
		if p7, p8 := points(t, db, schema, 7), points(t, db, schema, 8); p7 != 55 || p8 != 20 {
			t.Errorf("points %d and %d, want 55 and 20", p7, p8)
		}
	})
}
