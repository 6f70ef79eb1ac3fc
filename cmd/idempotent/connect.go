package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/lib/pq"
)

// probe is the dialer of a command's connections: it records whether a
// connection to the server ever opened, which tells a server that is not
// there (cannot reach the database) from one that answered in another
// protocol or not at all (not a Postgres or MySQL server).
type probe struct {
	d      net.Dialer
	opened atomic.Bool
	addr   atomic.Value // string: the last address a connection opened to
}

// DialContext opens a connection and records that it did.
func (p *probe) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := p.d.DialContext(ctx, network, address)
	if err == nil {
		p.addr.Store(address)
		p.opened.Store(true)
	}
	return c, err
}

// Dial is DialContext without a context (pq.Dialer).
func (p *probe) Dial(network, address string) (net.Conn, error) {
	return p.DialContext(context.Background(), network, address)
}

// DialTimeout is Dial with a time limit (pq.Dialer).
func (p *probe) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.DialContext(ctx, network, address)
}

// address is where the last connection opened, or "the server" before any.
func (p *probe) address() string {
	if a, ok := p.addr.Load().(string); ok {
		return a
	}
	return "the server"
}

// connector returns t's database/sql connector, its connections dialled
// through p. Its error is a connection string the driver refuses.
func connector(t target, p *probe) (driver.Connector, error) {
	switch t.kind {
	case kindPostgres:
		c, err := pq.NewConnector(t.dsn)
		if err != nil {
			return nil, err
		}
		c.Dialer(p)
		return c, nil
	case kindMySQL:
		cfg, err := mysql.ParseDSN(t.dsn)
		if err != nil {
			return nil, err
		}
		cfg.DialFunc = p.DialContext
		return mysql.NewConnector(cfg)
	}
	return nil, nil // SQLite opens by driver name: no network
}

// openDB opens t's pool without connecting.
func openDB(t target, p *probe) (*sql.DB, error) {
	c, err := connector(t, p)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return sql.Open(t.driver, t.dsn)
	}
	return sql.OpenDB(c), nil
}

// errNoAnswer is a connection that opened but on which the server did not
// complete the driver's handshake in time.
var errNoAnswer = errors.New("no answer")

// pingError names the problem of a failed first contact: the label of the
// one-line message the command prints before the driver's own words.
func (d *database) pingError(err error) error {
	var state interface{ SQLState() string }
	var my *mysql.MySQLError
	server := map[string]string{kindPostgres: "Postgres", kindMySQL: "MySQL or MariaDB"}[d.target.kind]
	switch {
	case errors.As(err, &state) && (state.SQLState() == "28P01" || state.SQLState() == "28000"),
		errors.As(err, &my) && my.Number == 1045:
		return fmt.Errorf("authentication failed at %s: %w", d.shown, err)
	case errors.As(err, &state) && state.SQLState() == "3D000",
		errors.As(err, &my) && my.Number == 1049:
		return fmt.Errorf("no such database at %s: %w", d.shown, err)
	case d.target.kind == kindSQLite:
		return fmt.Errorf("cannot open the SQLite database at %s: %w", d.shown, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("interrupted while connecting to %s: %w", d.shown, err)
	case !d.probe.opened.Load():
		return fmt.Errorf("cannot reach the database at %s: %w", d.shown, err)
	case errors.Is(err, errNoAnswer) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("not a %s server at %s, or one too busy to answer: the connection opened but no %s handshake came back within %v (%s): %w",
			server, d.probe.address(), server, connectTimeout, d.shown, err)
	case errors.Is(err, pq.ErrSSLNotSupported):
		// lib/pq takes any answer but 'S' to its TLS request for "no".
		return fmt.Errorf("no TLS at %s (%s): the sslmode asks for it (lib/pq's default is require; a server without TLS wants sslmode=disable), or it is not a Postgres server: %w",
			d.probe.address(), d.shown, err)
	case notTheProtocol(d.target.kind, err):
		return fmt.Errorf("not a %s server at %s: it answered in another protocol (%s): %w", server, d.probe.address(), d.shown, err)
	}
	return fmt.Errorf("cannot connect to the database at %s: %w", d.shown, err)
}

// notTheProtocol reports an error of a connection that opened and then
// failed neither with the database's own error, nor on the network, nor in
// TLS: the bytes that came back were not the database's protocol.
func notTheProtocol(kind string, err error) bool {
	var (
		netErr  net.Error
		state   interface{ SQLState() string }
		myErr   *mysql.MySQLError
		tlsRec  tls.RecordHeaderError
		tlsAl   tls.AlertError
		x509Err x509.UnknownAuthorityError
		hostErr x509.HostnameError
		certErr *tls.CertificateVerificationError
	)
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), // closed: not a protocol
		errors.As(err, &netErr), errors.As(err, &tlsRec), errors.As(err, &tlsAl),
		errors.As(err, &x509Err), errors.As(err, &hostErr), errors.As(err, &certErr):
		return false
	case kind == kindPostgres:
		return !errors.As(err, &state) // the server's own error has a SQLSTATE
	case kind == kindMySQL:
		return !errors.As(err, &myErr) && (errors.Is(err, mysql.ErrMalformPkt) || errors.Is(err, mysql.ErrPktSync) || errors.Is(err, mysql.ErrPktSyncMul))
	}
	return false
}
