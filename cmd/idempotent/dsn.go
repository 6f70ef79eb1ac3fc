package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	_ "github.com/lib/pq" // the "postgres" driver

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
	mysqlDialect "github.com/txclaim/idempotent/mysql"
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
// An unquoted value runs to the next " key=" (lib/pq would refuse a space
// in it, but the words after the space are still the password's).
var kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|.*?)(\s+[a-z_][a-z0-9_]*\s*=|$)`)

// kvStart matches the start of a key/value connection string: a key, then
// "=".
var kvStart = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)

// shape tells the syntax of a connection string, as classify, secrets and
// redactDSN read it: "url" (a scheme and "://"), "kv" (key=value pairs),
// "mysql" (go-sql-driver/mysql's user:pass@tcp(host)/db) or "" (anything
// else: an SQLite path, or a mistake).
func shape(dsn string) string {
	switch i := strings.Index(dsn, "://"); {
	case i > 0 && !strings.ContainsAny(dsn[:i], " =@/"):
		return "url"
	case kvStart.MatchString(dsn):
		return "kv"
	case mysqlNet.MatchString(dsn):
		return "mysql"
	}
	return ""
}

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
// must, and its errors never quote dsn (which may hold a password). A
// string it cannot tell is an error that says what it looks like.
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
		if err := checkURL(dsn); err != nil {
			return target{}, err
		}
		// lib/pq takes only a lower-case scheme for a URL, and anything
		// else for key=value pairs.
		dsn = scheme + dsn[len(scheme):]
		return target{kind: kindPostgres, driver: "postgres", dsn: dsn, dialect: postgres.New()}, nil
	case scheme == "mysql":
		d, err := mysqlFromURL(dsn)
		if err != nil {
			return target{}, err
		}
		return mysqlTarget(d)
	case scheme != "":
		return target{}, fmt.Errorf("unknown connection string scheme %q: want postgres://, mysql:// or sqlite:", scheme)
	case shape(dsn) == "kv":
		if err := checkKeyValuePort(dsn); err != nil {
			return target{}, err
		}
		return target{kind: kindPostgres, driver: "postgres", dsn: dsn, dialect: postgres.New()}, nil
	case shape(dsn) == "mysql":
		return mysqlTarget(dsn)
	case looksLikeSQLiteFile(dsn):
		return sqliteTarget(dsn)
	}
	return target{}, notAConnectionString(dsn)
}

// notAConnectionString is the error for a string without a scheme, a
// MySQL network part, an SQLite file's name or a key=value pair: it says
// what the string looks like, without quoting it.
func notAConnectionString(dsn string) error {
	lower := strings.ToLower(dsn)
	for _, s := range []string{"postgresql", "postgres", "mysql", "sqlite"} {
		if strings.HasPrefix(lower, s) {
			return fmt.Errorf("not a connection string: it starts with %s but not %s://", s, s)
		}
	}
	switch st, err := os.Stat(dsn); {
	case err == nil && st.IsDir():
		return errors.New("not a connection string but a directory: an SQLite database is a file, sqlite:PATH")
	case err == nil:
		return errors.New("not a connection string but a file whose name does not end in .db, .sqlite or .sqlite3: write sqlite:PATH for an SQLite database")
	case strings.Contains(dsn, "@"):
		return errors.New("not a connection string: user:password@host… with no scheme; write postgres://user:password@host:5432/db, mysql://user:password@host:3306/db or user:password@tcp(host:3306)/db")
	}
	return errors.New("not a connection string: want postgres://…, host=… dbname=…, mysql://…, user:pass@tcp(host:3306)/db, sqlite:PATH or a PATH ending in .db, .sqlite or .sqlite3")
}

// checkURL parses a postgres:// URL as the driver will, and names what is
// wrong with it without quoting it: url.Parse's own error quotes the URL,
// password and all.
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("not a valid URL: %s", urlProblem(err))
	}
	return checkPort(u.Port())
}

// urlProblem is what url.Parse found wrong, in words that quote no part of
// the URL.
func urlProblem(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return "it does not parse"
	}
	msg := ue.Err.Error()
	switch {
	case strings.Contains(msg, "invalid port"):
		return "the port after the host is not a number"
	case strings.Contains(msg, "escape"):
		return "a '%' not followed by two hexadecimal digits (percent-encode a '%' in a password as %25)"
	case strings.Contains(msg, "userinfo"):
		return "the user or password holds a character a URL does not allow there (percent-encode it: ' ' %20, '@' %40, ':' %3A, '/' %2F)"
	case strings.Contains(msg, "control character"):
		return "it contains a control character"
	}
	return "it does not parse"
}

// checkPort refuses a port that is not a number from 1 to 65535 ("" is
// the default port).
func checkPort(port string) error {
	if port == "" {
		return nil
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return errors.New("the port is not a number from 1 to 65535")
	}
	return nil
}

// kvPort finds port=… in a key/value connection string.
var kvPort = regexp.MustCompile(`(?:^|\s)port\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]*)`)

// checkKeyValuePort checks the port of a key/value connection string,
// which lib/pq leaves to the dialer ("unknown port", as if the server did
// not answer).
func checkKeyValuePort(dsn string) error {
	for _, m := range kvPort.FindAllStringSubmatch(dsn, -1) {
		for _, p := range strings.Split(strings.Trim(m[1], "'"), ",") {
			if err := checkPort(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// mysqlTarget checks a go-sql-driver/mysql DSN as the driver parses it,
// and its TCP port, which the driver leaves to the dialer.
func mysqlTarget(dsn string) (target, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return target{}, err
	}
	if cfg.Net == "tcp" || cfg.Net == "tcp4" || cfg.Net == "tcp6" {
		_, port, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			return target{}, errors.New("the address is not host:port")
		}
		if err := checkPort(port); err != nil {
			return target{}, err
		}
	}
	return target{kind: kindMySQL, driver: "mysql", dsn: dsn, dialect: mysqlDialect.New()}, nil
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
		return "", fmt.Errorf("not a valid URL: %s", urlProblem(err))
	}
	if err := checkPort(u.Port()); err != nil {
		return "", err
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
var urlPassword = regexp.MustCompile(`(?i)[?&]password=(([^&#]*))`)

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
	// user:password@host…: the text between the first ':' and the last
	// '@' may be the password, whatever the rest is.
	userinfo := func(s string) {
		if at := strings.LastIndex(s, "@"); at >= 0 {
			if _, p, ok := strings.Cut(s[:at], ":"); ok {
				add(p)
			}
		}
	}
	switch shape(dsn) {
	case "url":
		i := strings.Index(dsn, "://")
		if u, err := url.Parse(dsn); err == nil {
			if p, ok := u.User.Password(); ok {
				add(p)
			}
			if q, err := url.ParseQuery(u.RawQuery); err == nil {
				for k, vs := range q {
					if strings.EqualFold(k, "password") {
						for _, v := range vs {
							add(v)
						}
					}
				}
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
		// And to the end of the string after "password=": '&' and '#'
		// may be the password's own.
		for _, m := range urlPassword.FindAllStringSubmatchIndex(dsn, -1) {
			add(dsn[m[3]:])
			add(dsn[m[4]:m[5]])
		}
	case "kv":
		for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
			p := strings.Trim(m[2], "'")
			add(p)
			add(m[2])
			// lib/pq quotes a word of a value it cannot parse.
			for _, w := range strings.Fields(p) {
				if len(w) >= 3 {
					add(w)
				}
			}
		}
	case "mysql":
		_, p, _ := splitMySQLUser(dsn)
		add(p)
		userinfo(dsn)
	default:
		userinfo(dsn)
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

// redactDSN returns dsn, which classify took, with any password replaced
// by xxxxx: a URL's, in its user information or its query (a query that
// does not parse is left out whole); a password=… pair's; and in anything
// else, what stands between the first ':' and the last '@'.
func redactDSN(dsn string) string {
	switch shape(dsn) {
	case "url":
		u, err := url.Parse(dsn)
		if err != nil {
			return "(a connection string that is not a valid URL)"
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
		if u.RawQuery != "" {
			q, err := url.ParseQuery(u.RawQuery)
			for k := range q {
				if strings.EqualFold(k, "password") {
					q[k] = []string{redacted}
				}
			}
			u.RawQuery = q.Encode()
			if err != nil {
				u.RawQuery = "…"
			}
		}
		u.Fragment, u.RawFragment = "", ""
		return u.String()
	case "kv":
		return kvPassword.ReplaceAllString(dsn, "${1}"+redacted+"${3}")
	}
	return redactUserinfo(dsn)
}

// redactUserinfo replaces what stands between the first ':' and the last
// '@' of s, user:password@host…, by xxxxx.
func redactUserinfo(s string) string {
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return s
	}
	user, _, hasPassword := strings.Cut(s[:at], ":")
	if !hasPassword {
		return s
	}
	return user + ":" + redacted + s[at:]
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

// clean wraps err so that its text carries no password. The redacted
// connection string it shows is left as it is: a short password may be a
// part of its words.
func (d *database) clean(err error) error {
	if err == nil {
		return nil
	}
	if d.shown == "" {
		return scrubbed{msg: scrub(err.Error(), d.secrets), err: err}
	}
	parts := strings.Split(err.Error(), d.shown)
	for i := range parts {
		parts[i] = scrub(parts[i], d.secrets)
	}
	return scrubbed{msg: strings.Join(parts, d.shown), err: err}
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

// kindOf is the kind of database -dsn or $DATABASE_URL names, for a check
// made before it is opened: "" when there is none or it does not classify
// (open says why).
func (c *command) kindOf() string {
	dsn, err := c.dsnFlag()
	if err != nil {
		return ""
	}
	t, err := classify(dsn)
	if err != nil {
		return ""
	}
	return t.kind
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
	d := &database{secrets: secrets(dsn, c.e.getenv)}
	t, err := classify(dsn)
	if err != nil {
		// What the string holds is not known, so none of it is shown.
		return nil, usageError{d.clean(fmt.Errorf("bad connection string: %w", err)).Error()}
	}
	d.shown = redactDSN(dsn)
	d.target = t
	if t.kind == kindSQLite {
		if err := checkSQLitePath(t.path, create); err != nil {
			return nil, d.clean(err)
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

// checkSQLitePath names what SQLite would only call "unable to open
// database file": a directory, or a file (or, when the command may create
// it, its directory) that is not there.
func checkSQLitePath(path string, create bool) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir():
		return fmt.Errorf("no SQLite database at %s: it is a directory", path)
	case err == nil:
		return nil
	case !create:
		return fmt.Errorf("no SQLite database at %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("no SQLite database at %s, and no directory %s to create it in", path, dir)
	}
	return nil
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
