package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
)

// driverConfig is a database/sql driver for Postgres with extra connection
// parameters, written on the command line as "pq", "pgx" or, say,
// "pq+binary_parameters=yes" or "pgx+default_query_exec_mode=exec".
type driverConfig struct {
	spec   string // as given
	driver string // "pq" or "pgx"
	params string // name=value pairs joined by &
}

func parseDriver(spec string) (driverConfig, error) {
	base, extra, _ := strings.Cut(spec, "+")
	if base != "pq" && base != "pgx" {
		return driverConfig{}, fmt.Errorf("driver %q: want pq or pgx, optionally followed by +param=value[&param=value]", spec)
	}
	c := driverConfig{spec: spec, driver: base}
	if extra != "" {
		for _, p := range strings.Split(extra, "&") {
			if !strings.Contains(p, "=") {
				return driverConfig{}, fmt.Errorf("driver %q: parameter %q is not name=value", spec, p)
			}
		}
		c.params = extra
	}
	return c, nil
}

// label is the report's name for the configuration.
func (c driverConfig) label() string {
	name := map[string]string{"pq": "lib/pq", "pgx": "pgx stdlib"}[c.driver]
	if c.params != "" {
		name += " (" + strings.ReplaceAll(c.params, "&", ", ") + ")"
	}
	return name
}

// nativeArrays says the driver takes []int64 parameters as they are.
func (c driverConfig) nativeArrays() bool { return c.driver == "pgx" }

// dsn adds the configuration's parameters to dsn (URL or key=value form).
func (c driverConfig) dsn(dsn string) (string, error) {
	if c.params == "" {
		return dsn, nil
	}
	params := strings.Split(c.params, "&")
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		q := u.Query()
		for _, p := range params {
			k, v, _ := strings.Cut(p, "=")
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " " + strings.Join(params, " "), nil
}

// connector returns a connector whose connections count their network
// writes in writes.
func (c driverConfig) connector(dsn string, writes *atomic.Int64) (driver.Connector, error) {
	dsn, err := c.dsn(dsn)
	if err != nil {
		return nil, err
	}
	switch c.driver {
	case "pq":
		conn, err := pq.NewConnector(dsn)
		if err != nil {
			return nil, err
		}
		conn.Dialer(countingDialer{writes: writes})
		return conn, nil
	default:
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		d := countingDialer{writes: writes}
		cfg.DialFunc = d.DialContext
		return stdlib.GetConnector(*cfg), nil
	}
}

// open returns the plain database and the GuardConnector one, each with a
// pool of n connections.
func (c driverConfig) open(dsn string, n int, writes *atomic.Int64) (plain, guarded *sql.DB, err error) {
	conn, err := c.connector(dsn, writes)
	if err != nil {
		return nil, nil, err
	}
	plain = sql.OpenDB(conn)
	guarded = sql.OpenDB(idempotent.GuardConnector(conn))
	for _, db := range []*sql.DB{plain, guarded} {
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
	}
	return plain, guarded, nil
}

// countingDialer dials TCP and counts every write on its connections: with
// these drivers a write is a flush of the protocol messages the client
// sends before it waits for the server, so writes per message are round
// trips per message.
type countingDialer struct{ writes *atomic.Int64 }

func (d countingDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

func (d countingDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, network, address)
}

func (d countingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var nd net.Dialer
	conn, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, writes: d.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}
