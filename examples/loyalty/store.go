package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// store is the loyalty service's database: balances, a point ledger and,
// for the library's run, the claim table. Each run gets tables of its own,
// named with a random prefix and dropped by cleanup.
type store struct {
	db      *sql.DB
	d       dialect.Dialect
	kind    database
	desc    string // for the header line, password redacted
	prefix  string
	tables  []string
	dropDir string // the embedded database's directory, removed by cleanup
}

// openStore opens the database and checks that it answers.
func openStore(ctx context.Context, t target, conns int) (*store, error) {
	s := &store{prefix: "loyalty_demo_" + randomHex(4) + "_", desc: t.desc, kind: databases[t.kind]}
	if t.kind == "sqlite" && t.path == "" {
		dir, err := os.MkdirTemp("", "loyalty-demo-")
		if err != nil {
			return nil, fmt.Errorf("embedded database: %w", err)
		}
		s.dropDir = dir
		t.path = filepath.Join(dir, "loyalty.db")
		s.desc = "SQLite (embedded, " + t.path + ")"
	}
	var err error
	if s.db, s.d, err = s.kind.open(t); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("database %s: %w", s.desc, err)
	}
	s.db.SetMaxOpenConns(conns)
	s.db.SetMaxIdleConns(conns)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.db.PingContext(pctx); err != nil {
		s.cleanup()
		return nil, s.kind.pingError(s.desc, err)
	}
	return s, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// q rewrites ? placeholders as $1, $2, … for Postgres.
func (s *store) q(query string) string {
	if s.d.Name() != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// loyaltyTables creates a run's balances and point ledger, with every
// customer at 0 points, and returns their names.
func (s *store) loyaltyTables(ctx context.Context, run string, customers int) (balances, ledger string, err error) {
	balances, ledger = s.prefix+run+"_balances", s.prefix+run+"_point_ledger"
	s.tables = append(s.tables, balances, ledger)
	stmts := []string{
		"CREATE TABLE " + balances + " (customer_id BIGINT PRIMARY KEY, points BIGINT NOT NULL)",
		// The guide's ledger, without a unique key on order_id: the naive
		// consumer relies on its check instead.
		"CREATE TABLE " + ledger + " (order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, points BIGINT NOT NULL)",
		"CREATE INDEX " + ledger + "_order ON " + ledger + " (order_id)",
	}
	for _, st := range stmts {
		if _, err := s.db.ExecContext(ctx, st); err != nil {
			return "", "", fmt.Errorf("create tables: %w", err)
		}
	}
	for first := 1; first <= customers; first += 500 {
		var vals []string
		var args []any
		for c := first; c < first+500 && c <= customers; c++ {
			vals = append(vals, "(?, 0)")
			args = append(args, c)
		}
		if _, err := s.db.ExecContext(ctx, s.q("INSERT INTO "+balances+" (customer_id, points) VALUES "+strings.Join(vals, ", ")), args...); err != nil {
			return "", "", fmt.Errorf("create customers: %w", err)
		}
	}
	return balances, ledger, nil
}

// credit is the effect: add the points to the balance and write the ledger
// row, both through tx.
func (s *store) credit(ctx context.Context, tx *sql.Tx, balances, ledger string, o orderCompleted) error {
	if _, err := tx.ExecContext(ctx, s.q("UPDATE "+balances+" SET points = points + ? WHERE customer_id = ?"), o.points(), o.CustomerID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, s.q("INSERT INTO "+ledger+" (order_id, customer_id, points) VALUES (?, ?, ?)"), o.OrderID, o.CustomerID, o.points())
	return err
}

// naiveCredit creates the naive run's tables and returns its check-then-act
// step, whatever the broker.
func (s *store) naiveCredit(ctx context.Context, customers int) (func(context.Context, orderCompleted) (idempotent.Outcome, error), func(context.Context) (int64, error), error) {
	balances, ledger, err := s.loyaltyTables(ctx, "naive", customers)
	if err != nil {
		return nil, nil, err
	}
	apply := func(ctx context.Context, o orderCompleted) (idempotent.Outcome, error) {
		var n int
		if err := s.db.QueryRowContext(ctx, s.q("SELECT COUNT(*) FROM "+ledger+" WHERE order_id = ?"), o.OrderID).Scan(&n); err != nil {
			return 0, err
		}
		if n > 0 {
			return idempotent.Duplicate, nil // the check caught it
		}
		priceLookup(ctx) // between the check and the act: the gap
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		if err := s.credit(ctx, tx, balances, ledger, o); err != nil {
			_ = tx.Rollback()
			return 0, err
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
		return idempotent.Applied, nil
	}
	return apply, s.credited(balances), nil
}

// libraryCredit creates the library run's tables and its middleware, and
// returns the credit to run in the claim's transaction, whatever the broker.
func (s *store) libraryCredit(ctx context.Context, customers int) (*idempotent.Middleware, func(context.Context, *sql.Tx, orderCompleted) error, func(context.Context) (int64, error), error) {
	balances, ledger, err := s.loyaltyTables(ctx, "idempotent", customers)
	if err != nil {
		return nil, nil, nil, err
	}
	claims := s.claimTable()
	mw, err := idempotent.New(s.db, s.d, "loyalty", idempotent.WithTable(claims))
	if err != nil {
		return nil, nil, nil, err
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		return nil, nil, nil, err
	}
	credit := func(ctx context.Context, tx *sql.Tx, o orderCompleted) error {
		return s.credit(ctx, tx, balances, ledger, o)
	}
	return mw, credit, s.credited(balances), nil
}

// claimTable returns the name of the run's claim table, and has cleanup
// drop it and the horizon table its EnsureSchema creates beside it.
func (s *store) claimTable() string {
	claims := s.prefix + "processed_messages"
	horizon := s.kind.horizon(claims)
	s.tables = append(s.tables, horizon, claims)
	return claims
}

func (s *store) credited(balances string) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		var n sql.NullInt64
		err := s.db.QueryRowContext(ctx, "SELECT SUM(points) FROM "+balances).Scan(&n)
		return n.Int64, err
	}
}

// cleanup drops the demo's tables and closes the database.
func (s *store) cleanup() {
	if s.db != nil && s.dropDir == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i := len(s.tables) - 1; i >= 0; i-- {
			_, _ = s.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.tables[i])
		}
	}
	if s.db != nil {
		_ = s.db.Close()
	}
	if s.dropDir != "" {
		_ = os.RemoveAll(s.dropDir)
	}
}
