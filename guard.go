package idempotent

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/txclaim/idempotent/dialect"
)

// The autocommit guard.
//
// ProcessMessage and RunTx (and every entry point built on their loop) put a token in the context they begin the transaction
// with and hand to the handler. A connection opened through GuardConnector
// binds the token when it begins that transaction. From then on, any
// statement run with a context carrying the token on any other guarded
// connection — the classic db.ExecContext(ctx, …) instead of
// tx.ExecContext(ctx, …) — fails with ErrAutocommit before it reaches the
// database, and the token remembers it, so the transaction is rolled back
// even if the handler ignores the error and returns nil.
//
// Where the dialect implements dialect.ImplicitCommitter (MySQL, MariaDB),
// the token also carries its test, and a statement sent through the claim's
// own transaction that the database would commit implicitly (DDL, LOCK
// TABLES, …) fails with ErrAutocommit the same way, before it reaches the
// database.
//
// The connection also wraps the transaction it begins with a token
// (guardTx): only the middleware ends it. A handler's tx.Commit() or
// tx.Rollback() rolls the transaction back, records a violation and fails
// with ErrAutocommit, so nothing of the attempt commits. And where the
// dialect implements dialect.ImplicitRollbacker (MySQL, MariaDB), a
// statement of the token that fails with an error after which the database
// has rolled the transaction back and left it (an InnoDB deadlock) ends the
// token: every further statement of it is refused with ErrAutocommit,
// since it would commit on its own, and the attempt fails even if the
// handler returns nil.

type tokenKey struct{}

// txToken ties one attempt's context to the connection running its
// transaction.
type txToken struct {
	conn atomic.Pointer[guardConn]
	// implicit, when set, is the dialect's test for statements its
	// database commits implicitly (dialect.ImplicitCommitter).
	implicit dialect.ImplicitCommitter
	// rollbacks, when set, is the dialect's test for failures after which
	// its database has rolled the transaction back
	// (dialect.ImplicitRollbacker).
	rollbacks dialect.ImplicitRollbacker
	// turn is set, on the token a coalesced group's transaction was begun
	// with, to the token of the member whose handler runs: a violation
	// found without a statement's context (a handler's tx.Commit) is that
	// member's.
	turn atomic.Pointer[txToken]
	// ending is set by the middleware right before it commits or rolls
	// back the transaction itself (endTx): only then may guardTx end it.
	ending atomic.Bool
	mu     sync.Mutex
	broken error
	// ended, once set, says why the token's transaction is over although
	// the middleware did not end it: every further statement of the token
	// is refused.
	ended error
}

// withoutToken returns ctx without a claim's token, for a statement of
// the middleware's own that must run whatever a handler did to the
// transaction (the reset of a session setting).
func withoutToken(ctx context.Context) context.Context {
	return context.WithValue(ctx, tokenKey{}, (*txToken)(nil))
}

func tokenFrom(ctx context.Context) *txToken {
	t, _ := ctx.Value(tokenKey{}).(*txToken)
	return t
}

// violation returns the first guard failure recorded for this attempt.
func (t *txToken) violation() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.broken
}

func (t *txToken) violate(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.broken == nil {
		t.broken = err
	}
}

// end records that the token's transaction is over (why), although the
// middleware did not end it.
func (t *txToken) end(why error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended == nil {
		t.ended = why
	}
}

// endedBy returns why the token's transaction ended behind the
// middleware's back (see end), or nil.
func (t *txToken) endedBy() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ended
}

// current is the token a violation of the transaction t was begun with is
// charged to: the member's whose handler runs in a coalesced group, t
// itself otherwise.
func (t *txToken) current() *txToken {
	if cur := t.turn.Load(); cur != nil {
		return cur
	}
	return t
}

// failed is told of every failure of a statement run with ctx on c: one
// after which the database rolled the token's transaction back ends the
// token (see end).
func (c *guardConn) failed(ctx context.Context, err error) {
	if err == nil {
		return
	}
	t := tokenFrom(ctx)
	if t == nil || t.rollbacks == nil || t.conn.Load() != c || !t.rollbacks.RollsBackImplicitly(err) {
		return
	}
	t.end(fmt.Errorf("the database rolled the transaction back when a statement failed (%w)", err))
}

// check fails if ctx belongs to a claim transaction running on another
// connection than c.
func (c *guardConn) check(ctx context.Context, op, query string) error {
	t := tokenFrom(ctx)
	if t == nil {
		return nil
	}
	if t.conn.Load() == c {
		if why := t.endedBy(); why != nil {
			err := fmt.Errorf("%w: the handler ran %q after the claim's transaction had ended (%w): it would commit on its own, outside any transaction", ErrAutocommit, truncate(query, 80), why)
			t.violate(err)
			return err
		}
		if endsTransaction(query) {
			err := fmt.Errorf("%w: the handler ran %q, which would end the claim's transaction behind the middleware's back", ErrAutocommit, truncate(query, 80))
			t.violate(err)
			return err
		}
		if t.implicit != nil && t.implicit.CommitsImplicitly(query) {
			err := fmt.Errorf("%w: the handler ran %q, which the database commits implicitly: it would commit the claim with the effect so far, and run the rest outside any transaction (run DDL, LOCK TABLES and the like outside handlers)", ErrAutocommit, truncate(query, 80))
			t.violate(err)
			return err
		}
		return nil
	}
	err := fmt.Errorf("%w: %s %q ran with the handler's context on a connection outside the transaction (use the *sql.Tx)", ErrAutocommit, op, truncate(query, 80))
	t.violate(err)
	return err
}

// endsTransaction reports whether query starts with a statement that begins,
// commits or rolls back a transaction: BEGIN, START TRANSACTION, COMMIT, END,
// ABORT, ROLLBACK (but not ROLLBACK TO a savepoint) or PREPARE TRANSACTION.
// Only the first statement of a string is looked at; WithStrictGuard catches
// the rest.
func endsTransaction(query string) bool {
	rest := query
	// word returns the next keyword as written; callers compare it with
	// strings.EqualFold, so the check allocates nothing on the hot path.
	word := func() string {
		rest = skipSpaceAndComments(rest)
		i := 0
		for i < len(rest) && (rest[i]|0x20 >= 'a' && rest[i]|0x20 <= 'z') {
			i++
		}
		w := rest[:i]
		rest = rest[i:]
		return w
	}
	is := strings.EqualFold
	switch w := word(); {
	case is(w, "BEGIN"), is(w, "COMMIT"), is(w, "END"), is(w, "ABORT"):
		return true
	case is(w, "START"), is(w, "PREPARE"):
		return is(word(), "TRANSACTION")
	case is(w, "ROLLBACK"):
		next := word()
		if is(next, "WORK") || is(next, "TRANSACTION") {
			next = word()
		}
		return !is(next, "TO")
	}
	return false
}

// skipSpaceAndComments drops leading white space, -- comments and /* */
// comments.
func skipSpaceAndComments(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\r\n\f;")
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"):
			i := strings.Index(s, "*/")
			if i < 0 {
				return ""
			}
			s = s[i+2:]
		default:
			return s
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// GuardConnector wraps a driver connector so that statements which escape
// the claim's transaction fail with ErrAutocommit instead of committing on
// their own. Open the database with it:
//
//	connector, err := pq.NewConnector(dsn)
//	db := sql.OpenDB(idempotent.GuardConnector(connector))
//
// Statements are checked only when run with a context that ProcessMessage or RunTx
// handed to a handler; all other use of the database is unchanged. A handler
// that runs a statement with context.Background() on the *sql.DB cannot be
// caught this way. The transaction ProcessMessage (or RunTx, and every
// entry point built on them) begins is wrapped too: only the middleware
// commits or rolls it back, and a handler's tx.Commit() or tx.Rollback()
// rolls it back and fails with ErrAutocommit, so nothing of that attempt
// commits. The wrapped connections pass through every optional
// driver interface the driver's connections implement; Unwrap returns the
// driver's own connection for sql.Conn.Raw.
func GuardConnector(c driver.Connector) driver.Connector {
	return &guardConnector{c: c}
}

// OpenGuarded opens a database like sql.Open, with its connections wrapped
// by GuardConnector. driverName must be registered (for lib/pq, import
// github.com/lib/pq; its name is "postgres").
func OpenGuarded(driverName, dsn string) (*sql.DB, error) {
	probe, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, fmt.Errorf("idempotent: open %q: %w", driverName, err)
	}
	drv := probe.Driver()
	_ = probe.Close()
	var c driver.Connector
	if dc, ok := drv.(driver.DriverContext); ok {
		if c, err = dc.OpenConnector(dsn); err != nil {
			return nil, fmt.Errorf("idempotent: open %q: %w", driverName, err)
		}
	} else {
		c = dsnConnector{dsn: dsn, drv: drv}
	}
	return sql.OpenDB(GuardConnector(c)), nil
}

type dsnConnector struct {
	dsn string
	drv driver.Driver
}

func (d dsnConnector) Connect(context.Context) (driver.Conn, error) { return d.drv.Open(d.dsn) }
func (d dsnConnector) Driver() driver.Driver                        { return d.drv }

type guardConnector struct{ c driver.Connector }

func (g *guardConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := g.c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: conn}, nil
}

func (g *guardConnector) Driver() driver.Driver { return g.c.Driver() }

// Close closes the wrapped connector if it has a Close method.
func (g *guardConnector) Close() error {
	if c, ok := g.c.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// guardConn checks every statement's context, then delegates.
type guardConn struct {
	driver.Conn
}

var (
	_ driver.ConnBeginTx        = (*guardConn)(nil)
	_ driver.ConnPrepareContext = (*guardConn)(nil)
	_ driver.ExecerContext      = (*guardConn)(nil)
	_ driver.QueryerContext     = (*guardConn)(nil)
	_ driver.Pinger             = (*guardConn)(nil)
	_ driver.SessionResetter    = (*guardConn)(nil)
	_ driver.Validator          = (*guardConn)(nil)
	_ driver.NamedValueChecker  = (*guardConn)(nil)
)

// Unwrap returns the driver's own connection.
func (c *guardConn) Unwrap() driver.Conn { return c.Conn }

func (c *guardConn) Begin() (driver.Tx, error) { //nolint:staticcheck // driver.Conn requires it
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *guardConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	t := tokenFrom(ctx)
	if t != nil {
		if bound := t.conn.Load(); bound != nil && bound != c {
			err := fmt.Errorf("%w: a second transaction was begun with the handler's context", ErrAutocommit)
			t.violate(err)
			return nil, err
		}
	}
	var tx driver.Tx
	var err error
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		if opts.Isolation != driver.IsolationLevel(sql.LevelDefault) || opts.ReadOnly {
			return nil, errors.New("idempotent: driver does not support transaction options")
		}
		tx, err = c.Conn.Begin() //nolint:staticcheck // fallback for old drivers
	}
	if err != nil {
		return nil, err
	}
	if t == nil {
		return tx, nil
	}
	t.conn.CompareAndSwap(nil, c)
	return &guardTx{Tx: tx, t: t, ctx: ctx}, nil
}

// guardTx is a transaction begun with a claim's token: only the
// middleware, which marks the token before it ends the transaction
// (endTx), commits or rolls it back.
type guardTx struct {
	driver.Tx
	t   *txToken
	ctx context.Context // BeginTx's
}

// Commit commits the transaction when the middleware ends it; otherwise
// the handler is committing it itself, and the guard rolls it back
// instead (refuse).
func (g *guardTx) Commit() error {
	if g.t.ending.Load() {
		return g.Tx.Commit()
	}
	return g.refuse("Commit")
}

// Rollback rolls the transaction back. Unless the middleware ends it, or
// database/sql does because BeginTx's context ended, it is the handler's
// own and a violation (refuse).
func (g *guardTx) Rollback() error {
	if g.t.ending.Load() || g.ctx.Err() != nil {
		return g.Tx.Rollback()
	}
	return g.refuse("Rollback")
}

// refuse rolls the transaction back for a handler that tried to end it
// itself, and records the violation on the token of the handler running.
func (g *guardTx) refuse(op string) error {
	err := fmt.Errorf("%w: the handler called tx.%s on the claim's transaction: it committed or rolled back the transaction itself, which only the middleware may do; the guard rolled it back, so nothing of this attempt is committed", ErrAutocommit, op)
	t := g.t.current()
	t.violate(err)
	t.end(fmt.Errorf("the handler's tx.%s", op))
	if rbErr := g.Tx.Rollback(); rbErr != nil {
		return errors.Join(err, rbErr)
	}
	return err
}

func (c *guardConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *guardConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.check(ctx, "prepare", query); err != nil {
		return nil, err
	}
	var s driver.Stmt
	var err error
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		s, err = p.PrepareContext(ctx, query)
	} else {
		s, err = c.Conn.Prepare(query)
	}
	if err != nil {
		return nil, err
	}
	return &guardStmt{Stmt: s, conn: c, query: query}, nil
}

func (c *guardConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.check(ctx, "exec", query); err != nil {
		return nil, err
	}
	var res driver.Result
	var err error
	switch e := c.Conn.(type) {
	case driver.ExecerContext:
		res, err = e.ExecContext(ctx, query, args)
	case driver.Execer: //nolint:staticcheck // fallback for old drivers
		vals, verr := plainValues(args)
		if verr != nil {
			return nil, verr
		}
		res, err = e.Exec(query, vals)
	default:
		return nil, driver.ErrSkip
	}
	c.failed(ctx, err)
	return res, err
}

func (c *guardConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.check(ctx, "query", query); err != nil {
		return nil, err
	}
	var rows driver.Rows
	var err error
	switch q := c.Conn.(type) {
	case driver.QueryerContext:
		rows, err = q.QueryContext(ctx, query, args)
	case driver.Queryer: //nolint:staticcheck // fallback for old drivers
		vals, verr := plainValues(args)
		if verr != nil {
			return nil, verr
		}
		rows, err = q.Query(query, vals)
	default:
		return nil, driver.ErrSkip
	}
	c.failed(ctx, err)
	return rows, err
}

func (c *guardConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *guardConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *guardConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *guardConn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return defaultCheckNamedValue(nv)
}

// defaultCheckNamedValue applies database/sql's default conversion, as it
// would for a driver without a NamedValueChecker.
func defaultCheckNamedValue(nv *driver.NamedValue) error {
	v, err := driver.DefaultParameterConverter.ConvertValue(nv.Value)
	if err != nil {
		return err
	}
	nv.Value = v
	return nil
}

func plainValues(named []driver.NamedValue) ([]driver.Value, error) {
	vals := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, errors.New("idempotent: driver does not support named parameters")
		}
		vals[i] = nv.Value
	}
	return vals, nil
}

// guardStmt checks the context of each execution of a prepared statement.
type guardStmt struct {
	driver.Stmt
	conn  *guardConn
	query string
}

var (
	_ driver.StmtExecContext  = (*guardStmt)(nil)
	_ driver.StmtQueryContext = (*guardStmt)(nil)
)

func (s *guardStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := s.conn.check(ctx, "exec", s.query); err != nil {
		return nil, err
	}
	var res driver.Result
	var err error
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		res, err = e.ExecContext(ctx, args)
	} else {
		vals, verr := plainValues(args)
		if verr != nil {
			return nil, verr
		}
		res, err = s.Stmt.Exec(vals) //nolint:staticcheck // fallback for old drivers
	}
	s.conn.failed(ctx, err)
	return res, err
}

func (s *guardStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.conn.check(ctx, "query", s.query); err != nil {
		return nil, err
	}
	var rows driver.Rows
	var err error
	if q, ok := s.Stmt.(driver.StmtQueryContext); ok {
		rows, err = q.QueryContext(ctx, args)
	} else {
		vals, verr := plainValues(args)
		if verr != nil {
			return nil, verr
		}
		rows, err = s.Stmt.Query(vals) //nolint:staticcheck // fallback for old drivers
	}
	s.conn.failed(ctx, err)
	return rows, err
}

func (s *guardStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return s.conn.CheckNamedValue(nv)
}
