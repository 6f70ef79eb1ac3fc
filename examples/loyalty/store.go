package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	_ "github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// store is the loyalty service's database: balances, a point ledger and,
// for the library's run, the claim table. Each run gets tables of its own,
// named with a random prefix and dropped by cleanup.
type store struct {
	db      *sql.DB
	d       dialect.Dialect
	desc    string // for the header line, password redacted
	prefix  string
	tables  []string
	dropDir string // the embedded database's directory, removed by cleanup
}

// target is a database named by -db.
type target struct {
	kind string // "sqlite", "postgres" or "mysql"
	dsn  string // for the driver; "" for the embedded database
	path string // SQLite's file
	desc string // for the header line, password redacted
}

// parseDB reads -db: "" for an embedded SQLite file in a temporary
// directory, a postgres:// URL, a MySQL DSN (user:pass@tcp(host:3306)/db,
// optionally prefixed mysql://) or sqlite:PATH.
func parseDB(dsn string) (target, error) {
	switch {
	case dsn == "":
		return target{kind: "sqlite"}, nil
	case strings.HasPrefix(dsn, "sqlite:"):
		path := strings.TrimPrefix(dsn, "sqlite:")
		if _, err := sqlite.DSN(path); err != nil {
			return target{}, fmt.Errorf("-db: %w", err)
		}
		return target{kind: "sqlite", path: path, desc: "SQLite (" + path + ")"}, nil
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		u, err := url.Parse(dsn)
		if err != nil {
			return target{}, fmt.Errorf("-db: not a Postgres URL: %w", err)
		}
		return target{kind: "postgres", dsn: dsn, desc: "Postgres (" + u.Redacted() + ")"}, nil
	case strings.HasPrefix(dsn, "mysql://"), strings.Contains(dsn, "@tcp("), strings.Contains(dsn, "@unix("):
		dsn = strings.TrimPrefix(dsn, "mysql://")
		cfg, err := mysqldriver.ParseDSN(dsn)
		if err != nil {
			return target{}, fmt.Errorf("-db: not a MySQL DSN: %w", err)
		}
		if cfg.Passwd != "" {
			cfg.Passwd = "xxxxx"
		}
		return target{kind: "mysql", dsn: dsn, desc: "MySQL (" + cfg.FormatDSN() + ")"}, nil
	}
	return target{}, fmt.Errorf("-db %q: want a postgres:// URL, a MySQL DSN such as root@tcp(127.0.0.1:3306)/test, or sqlite:PATH", dsn)
}

// openStore opens the database and checks that it answers.
func openStore(ctx context.Context, t target, conns int) (*store, error) {
	s := &store{prefix: "loyalty_demo_" + randomHex(4) + "_", desc: t.desc}
	var err error
	switch t.kind {
	case "sqlite":
		path := t.path
		if path == "" {
			dir, derr := os.MkdirTemp("", "loyalty-demo-")
			if derr != nil {
				return nil, fmt.Errorf("embedded database: %w", derr)
			}
			s.dropDir = dir
			path = filepath.Join(dir, "loyalty.db")
			s.desc = "SQLite (embedded, " + path + ")"
		}
		s.d = sqlite.New()
		s.db, err = sqlite.Open(path)
	case "postgres":
		s.d = postgres.New()
		s.db, err = sql.Open("postgres", t.dsn)
	case "mysql":
		s.d = mysql.New()
		s.db, err = sql.Open("mysql", t.dsn)
	}
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("database %s: %w", s.desc, err)
	}
	s.db.SetMaxOpenConns(conns)
	s.db.SetMaxIdleConns(conns)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.db.PingContext(pctx); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("database %s does not answer: %w", s.desc, err)
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
	horizon := claims + "_horizon"
	switch s.d.Name() {
	case "postgres":
		horizon = postgres.HorizonName(claims)
	case "mysql":
		horizon = mysql.HorizonName(claims)
	}
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
