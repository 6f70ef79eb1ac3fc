package idempgx_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/internal/testenv"
)

// The code from here to the examples is what sqlc generates for pgx/v5
// (sql_package: "pgx/v5") from two queries:
//
//	-- name: AddPoints :exec
//	UPDATE balances SET points = points + $2 WHERE customer_id = $1;
//	-- name: Points :one
//	SELECT points FROM balances WHERE customer_id = $1;

// DBTX is sqlc's interface for a pool, a connection or a transaction.
type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
}

// NewQueries is sqlc's New.
func NewQueries(db DBTX) *Queries { return &Queries{db: db} }

// Queries is sqlc's generated query set.
type Queries struct{ db DBTX }

// WithTx returns the queries bound to tx, as sqlc generates it.
func (q *Queries) WithTx(tx pgx.Tx) *Queries { return &Queries{db: tx} }

const addPoints = `UPDATE balances SET points = points + $2 WHERE customer_id = $1`

// AddPointsParams are AddPoints's parameters.
type AddPointsParams struct {
	CustomerID int64
	Points     int64
}

// AddPoints is the generated :exec query.
func (q *Queries) AddPoints(ctx context.Context, arg AddPointsParams) error {
	_, err := q.db.Exec(ctx, addPoints, arg.CustomerID, arg.Points)
	return err
}

const points = `SELECT points FROM balances WHERE customer_id = $1`

// Points is the generated :one query.
func (q *Queries) Points(ctx context.Context, customerID int64) (int64, error) {
	row := q.db.QueryRow(ctx, points, customerID)
	var p int64
	err := row.Scan(&p)
	return p, err
}

// examplePool opens the Postgres at IDEMPOTENT_POSTGRES_DSN (default: the
// local server) and a schema of its own with a balances table, which the
// returned function drops.
func examplePool() (*pgxpool.Pool, string, func()) {
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	schema := testenv.UniqueName("example")
	for _, q := range []string{
		"CREATE SCHEMA " + schema,
		"CREATE TABLE " + schema + ".balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL)",
		"INSERT INTO " + schema + ".balances VALUES (42, 0)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			log.Fatal(err)
		}
	}
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
}

// A handler written with sqlc-generated pgx code runs inside the claim's
// transaction through Queries.WithTx. The second delivery of the same
// message is a duplicate and adds nothing.
func ExampleMiddleware_ProcessMessage_sqlc() {
	pool, schema, done := examplePool()
	defer done()
	ctx := context.Background()
	m, err := idempgx.New(pool, "loyalty", idempgx.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := m.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	queries := NewQueries(pool)

	for i := 0; i < 2; i++ {
		outcome, err := m.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:9912"}, func(ctx context.Context, tx pgx.Tx) error {
			// sqlc's queries are unqualified; here the example's own schema
			// stands in for the application's.
			if _, err := tx.Exec(ctx, "SET LOCAL search_path = "+schema); err != nil {
				return err
			}
			return queries.WithTx(tx).AddPoints(ctx, AddPointsParams{CustomerID: 42, Points: 10})
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	var p int64
	if err := pool.QueryRow(ctx, "SELECT points FROM "+schema+".balances WHERE customer_id = 42").Scan(&p); err != nil {
		log.Fatal(err)
	}
	fmt.Println("points:", p)
	// Output:
	// applied
	// duplicate
	// points: 10
}

// WrapMessage turns a handler of decoded messages into an exactly-once
// function.
func ExampleWrapMessage() {
	pool, schema, done := examplePool()
	defer done()
	ctx := context.Background()
	m, err := idempgx.New(pool, "loyalty", idempgx.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := m.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	type orderCompleted struct {
		EventID    string
		CustomerID int64
	}
	handle := idempgx.WrapMessage(m,
		func(e orderCompleted) (idempotent.Message, error) {
			return idempotent.Message{Key: "order-completed:" + e.EventID}, nil
		},
		func(ctx context.Context, tx pgx.Tx, e orderCompleted) error {
			_, err := tx.Exec(ctx, "UPDATE "+schema+".balances SET points = points + 10 WHERE customer_id = $1", e.CustomerID)
			return err
		})
	for _, e := range []orderCompleted{{"9912", 42}, {"9912", 42}, {"9913", 42}} {
		outcome, err := handle(ctx, e)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.EventID, outcome)
	}
	_ = idempotent.Applied
	// Output:
	// 9912 applied
	// 9912 duplicate
	// 9913 applied
}
