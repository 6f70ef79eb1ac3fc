package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver
	_ "github.com/lib/pq"              // the "postgres" driver

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// connectTimeout bounds the first contact with the database (a variable
// for the tests).
var connectTimeout = 10 * time.Second

// redacted is what a password is printed as.
const redacted = "xxxxx"

// The databases a connection string can name.
const (
	kindPostgres = "postgres"
	kindMySQL    = "mysql"
	kindSQLite   = "sqlite"
)

// dsnHelp describes the connection strings the commands take.
const dsnHelp = "connection string: postgres://… or host=… (Postgres), mysql://user:pass@host:3306/db or user:pass@tcp(host:3306)/db (MySQL, MariaDB), sqlite:PATH or a PATH ending in .db, .sqlite or .sqlite3 (SQLite) (default $DATABASE_URL)"

// kvPassword finds password=… in a key/value connection string, quoted or
// not.
var kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]+)`)

// mysqlNet finds the network part of a go-sql-driver/mysql DSN:
// "user:pass@tcp(host:3306)/db", "unix(/run/mysqld.sock)/db", "user@/db".
var mysqlNet = regexp.MustCompile(`(^|@)(tcp|tcp4|tcp6|unix)\(|^[^\s=/]*@/`)

// target is the database a connection string names, and how to reach it.
type target struct {
	kind    string // kindPostgres, kindMySQL or kindSQLite
	driver  string // the database/sql driver
	dsn     string // the driver's data source name
	path    string // SQLite: the database file
	dialect dialect.Dialect
}

// classify tells which database dsn names. It never parses more than it
// must, and its errors never quote dsn (which may hold a password).
func classify(dsn string) (target, error) {
	scheme := ""
	if i := strings.Index(dsn, "://"); i > 0 && !strings.ContainsAny(dsn[:i], " =@/") {
		scheme = strings.ToLower(dsn[:i])
	}
	switch {
	case strings.HasPrefix(dsn, "sqlite:"):
		path := strings.TrimPrefix(strings.TrimPrefix(dsn, "sqlite:"), "//")
		return sqliteTarget(path)
	case scheme == "postgres" || scheme == "postgresql":
		return target{kind: kindPostgres, driver: "postgres", dsn: dsn, dialect: postgres.New()}, nil
	case scheme == "mysql":
		d, err := mysqlFromURL(dsn)
		if err != nil {
			return target{}, err
		}
		return target{kind: kindMySQL, driver: "mysql", dsn: d, dialect: mysql.New()}, nil
	case scheme != "":
		return target{}, fmt.Errorf("unknown connection string scheme %q: want postgres://, mysql:// or sqlite:", scheme)
	case mysqlNet.MatchString(dsn):
		return target{kind: kindMySQL, driver: "mysql", dsn: dsn, dialect: mysql.New()}, nil
	case looksLikeSQLiteFile(dsn):
		return sqliteTarget(dsn)
	}
	return target{kind: kindPostgres, driver: "postgres", dsn: dsn, dialect: postgres.New()}, nil
}

// looksLikeSQLiteFile reports a bare path to an SQLite file: no key=value
// pairs, and the name ends in .db, .sqlite or .sqlite3.
func looksLikeSQLiteFile(s string) bool {
	if strings.ContainsAny(s, "=@") {
		return false
	}
	for _, ext := range []string{".db", ".sqlite", ".sqlite3"} {
		if strings.HasSuffix(strings.ToLower(s), ext) {
			return true
		}
	}
	return false
}

func sqliteTarget(path string) (target, error) {
	dsn, err := sqlite.DSN(path)
	if err != nil {
		return target{}, err
	}
	return target{kind: kindSQLite, driver: sqlite.DriverName, dsn: dsn, path: path, dialect: sqlite.New()}, nil
}

// mysqlFromURL turns mysql://user:pass@host:port/db?params into
// go-sql-driver/mysql's user:pass@tcp(host:port)/db?params. The port
// defaults to 3306; the parameters are the driver's.
func mysqlFromURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", errors.New("the mysql:// connection string is not a valid URL")
	}
	if u.Host == "" {
		return "", errors.New("the mysql:// connection string names no host")
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if strings.Contains(db, "/") {
		return "", errors.New("the mysql:// connection string's path must be one database name")
	}
	var b strings.Builder
	if u.User != nil {
		b.WriteString(u.User.Username())
		if p, ok := u.User.Password(); ok {
			b.WriteString(":" + p)
		}
		b.WriteString("@")
	}
	b.WriteString("tcp(" + host + ")/" + db)
	if u.RawQuery != "" {
		b.WriteString("?" + u.RawQuery)
	}
	return b.String(), nil
}

// urlPassword finds password=… in a URL's query, parsed or not (a query
// with a bad escape parses to nothing, but the text is still there).
var urlPassword = regexp.MustCompile(`(?i)([?&]password=)([^&#]*)`)

// secrets returns the passwords that dsn and the environment carry, so that
// no message prints them: as given, and as they may appear escaped. Where
// the string does not parse, every part that could be the password is
// taken.
func secrets(dsn string, getenv func(string) string) []string {
	var out []string
	if p := getenv("PGPASSWORD"); p != "" {
		out = append(out, p)
	}
	add := func(p string) {
		if p == "" {
			return
		}
		out = append(out, p, strings.TrimPrefix(url.UserPassword("", p).String(), ":"), url.QueryEscape(p))
		if q, err := url.PathUnescape(p); err == nil && q != p {
			out = append(out, q)
		}
		if q, err := url.QueryUnescape(p); err == nil && q != p {
			out = append(out, q)
		}
	}
	switch i := strings.Index(dsn, "://"); {
	case i > 0 && !strings.ContainsAny(dsn[:i], " =@/"):
		if u, err := url.Parse(dsn); err == nil {
			if p, ok := u.User.Password(); ok {
				add(p)
			}
		} else {
			// A URL that does not parse still carries its password: take
			// the text between the user's ':' and each '@' after it.
			rest := dsn[i+3:]
			if c := strings.Index(rest, ":"); c >= 0 && !strings.Contains(rest[:c], "@") {
				for at := c + 1; at < len(rest); at++ {
					if rest[at] == '@' {
						add(rest[c+1 : at])
					}
				}
			}
		}
		for _, m := range urlPassword.FindAllStringSubmatch(dsn, -1) {
			add(m[2])
		}
	case mysqlNet.MatchString(dsn):
		_, p, _ := splitMySQLUser(dsn)
		add(p)
	default:
		for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
			if p := strings.Trim(m[2], "'"); p != "" {
				out = append(out, p, m[2])
			}
		}
	}
	// Longest first, so that a password containing another is removed whole.
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// splitMySQLUser splits a go-sql-driver/mysql DSN at the '@' before its
// network part, as the driver does (the last '@' before the last '/'): the
// user, the password, and the rest from the '@' on. Without an '@' the user
// and password are "".
func splitMySQLUser(dsn string) (user, password, rest string) {
	end := strings.LastIndex(dsn, "/")
	if end < 0 {
		end = len(dsn)
	}
	at := strings.LastIndex(dsn[:end], "@")
	if at < 0 {
		return "", "", dsn
	}
	user, password, _ = strings.Cut(dsn[:at], ":")
	return user, password, dsn[at:]
}

// redactDSN returns dsn with any password replaced by xxxxx.
func redactDSN(dsn string) string {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "(a connection string that is not a valid URL)"
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
		u.RawQuery = strings.TrimPrefix(urlPassword.ReplaceAllString("?"+u.RawQuery, "${1}"+redacted), "?")
		return u.String()
	}
	if mysqlNet.MatchString(dsn) {
		user, password, rest := splitMySQLUser(dsn)
		if password == "" && !strings.Contains(strings.TrimSuffix(dsn, rest), ":") {
			return dsn
		}
		return user + ":" + redacted + rest
	}
	return kvPassword.ReplaceAllString(dsn, "${1}"+redacted)
}

// scrub removes every secret from msg.
func scrub(msg string, secrets []string) string {
	for _, s := range secrets {
		if len(s) >= 1 {
			msg = strings.ReplaceAll(msg, s, redacted)
		}
	}
	return msg
}

// scrubbed is an error whose text has the passwords removed.
type scrubbed struct {
	msg string
	err error
}

func (s scrubbed) Error() string { return s.msg }
func (s scrubbed) Unwrap() error { return s.err }

// database is an open connection pool and what it takes to talk about it
// safely.
type database struct {
	db      *sql.DB
	target  target
	shown   string // the DSN with the password redacted
	secrets []string
	probe   *probe // the dialer of its connections
}

// clean wraps err so that its text carries no password.
func (d *database) clean(err error) error {
	if err == nil {
		return nil
	}
	return scrubbed{msg: scrub(err.Error(), d.secrets), err: err}
}

// dsnFlag returns the connection string of -dsn or $DATABASE_URL.
func (c *command) dsnFlag() (string, error) {
	dsn := c.dsn
	if dsn == "" {
		dsn = c.e.getenv("DATABASE_URL")
	}
	if dsn == "" {
		return "", usageError{"no database: give -dsn or set DATABASE_URL"}
	}
	return dsn, nil
}

// open prepares the database named by -dsn or $DATABASE_URL without
// connecting to it. create says the command may create an SQLite file that
// does not exist yet; the other commands refuse a missing file, which
// opening would create empty.
func (c *command) open(create bool) (*database, error) {
	dsn, err := c.dsnFlag()
	if err != nil {
		return nil, err
	}
	d := &database{shown: redactDSN(dsn), secrets: secrets(dsn, c.e.getenv)}
	t, err := classify(dsn)
	if err != nil {
		return nil, usageError{d.clean(fmt.Errorf("bad connection string %s: %w", d.shown, err)).Error()}
	}
	d.target = t
	if t.kind == kindSQLite && !create {
		if _, err := os.Stat(t.path); err != nil {
			return nil, d.clean(fmt.Errorf("no SQLite database at %s: %w", t.path, err))
		}
	}
	d.probe = &probe{}
	db, err := openDB(t, d.probe)
	if err != nil {
		return nil, usageError{d.clean(fmt.Errorf("bad connection string %s: %w", d.shown, err)).Error()}
	}
	db.SetMaxOpenConns(2)
	d.db = db
	return d, nil
}

// ping checks that the database answers within connectTimeout, and names
// the problem when it does not. A driver that does not watch the context
// while it connects (lib/pq waits for a startup answer as long as the
// server stays silent) is left behind when the time is up or the command
// is interrupted: the command is about to exit.
func (d *database) ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.db.PingContext(pctx) }()
	var err error
	select {
	case err = <-done:
	case <-pctx.Done():
		err = pctx.Err()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", errNoAnswer, err)
		}
	}
	if err != nil {
		return d.clean(d.pingError(err))
	}
	return nil
}
