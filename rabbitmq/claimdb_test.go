package rabbitmq_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// claimDB is an in-memory database that knows one thing, the claims: a
// claim statement (INSERT … ON CONFLICT DO NOTHING, consumer and key as
// its first two arguments) inserts its key unless a committed claim or the
// transaction's own has it; COMMIT keeps a transaction's claims, ROLLBACK
// drops them, ROLLBACK TO SAVEPOINT drops those since the last SAVEPOINT (a
// coalesced group's, which claims each message under one of its own). Every
// other statement affects one row and is logged, so a handler's effect
// shows in effects. Concurrent claims of one key are not
// serialised as a database would: tests give each in-flight delivery its
// own key.
type claimDB struct {
	mu      sync.Mutex
	claims  map[string]bool
	effects []string // statements of committed transactions, other than the claim
}

// newMiddleware returns a Middleware on a new claimDB, with the Postgres
// dialect's statements (its optional abilities hidden: a batch is claimed
// key by key), and the claimDB.
func newMiddleware(t testing.TB, opts ...idempotent.Option) (*idempotent.Middleware, *claimDB) {
	t.Helper()
	cdb := &claimDB{claims: map[string]bool{}}
	db := sql.OpenDB(cdb)
	t.Cleanup(func() { _ = db.Close() })
	mw, err := idempotent.New(db, plainDialect{postgres.New()}, "loyalty", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw, cdb
}

// plainDialect is a dialect with only the methods every dialect has.
type plainDialect struct{ dialect.Dialect }

func (f *claimDB) claimed(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.claims[key]
}

func (f *claimDB) committed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.effects...)
}

func (f *claimDB) Connect(context.Context) (driver.Conn, error) { return &claimConn{db: f}, nil }
func (f *claimDB) Driver() driver.Driver                        { return claimDriver{f} }

type claimDriver struct{ db *claimDB }

func (d claimDriver) Open(string) (driver.Conn, error) { return &claimConn{db: d.db}, nil }

type claimConn struct {
	db *claimDB
	tx *claimTx
}

type claimTx struct {
	c       *claimConn
	claims  []string
	effects []string
	// mark is how many claims and effects the transaction had at its
	// last SAVEPOINT.
	mark [2]int
}

func (c *claimConn) Prepare(query string) (driver.Stmt, error) {
	return nil, fmt.Errorf("claimDB: prepare %q: not supported", query)
}

func (c *claimConn) Close() error { return nil }

func (c *claimConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *claimConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	if c.tx != nil {
		return nil, errors.New("claimDB: a transaction is open")
	}
	c.tx = &claimTx{c: c}
	return c.tx, nil
}

func (c *claimConn) ExecContext(_ context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.tx == nil {
		return nil, fmt.Errorf("claimDB: %q outside a transaction", query)
	}
	if strings.HasPrefix(query, "INSERT INTO") && strings.HasSuffix(query, "ON CONFLICT DO NOTHING") {
		key, _ := args[1].Value.(string)
		c.db.mu.Lock()
		defer c.db.mu.Unlock()
		if c.db.claims[key] {
			return driver.RowsAffected(0), nil
		}
		for _, k := range c.tx.claims {
			if k == key {
				return driver.RowsAffected(0), nil
			}
		}
		c.tx.claims = append(c.tx.claims, key)
		return driver.RowsAffected(1), nil
	}
	switch {
	case strings.HasPrefix(query, "SAVEPOINT"):
		c.tx.mark = [2]int{len(c.tx.claims), len(c.tx.effects)}
	case strings.HasPrefix(query, "ROLLBACK TO SAVEPOINT"):
		c.tx.claims, c.tx.effects = c.tx.claims[:c.tx.mark[0]], c.tx.effects[:c.tx.mark[1]]
	case strings.HasPrefix(query, "RELEASE SAVEPOINT"), strings.HasPrefix(query, "SET LOCAL"):
	default:
		c.tx.effects = append(c.tx.effects, query)
	}
	return driver.RowsAffected(1), nil
}

func (tx *claimTx) Commit() error {
	db := tx.c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	for _, k := range tx.claims {
		db.claims[k] = true
	}
	db.effects = append(db.effects, tx.effects...)
	tx.c.tx = nil
	return nil
}

func (tx *claimTx) Rollback() error {
	tx.c.tx = nil
	return nil
}
