package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	_ "github.com/lib/pq" // the Postgres driver
)

// connectTimeout bounds the first contact with the database.
const connectTimeout = 10 * time.Second

// redacted is what a password is printed as.
const redacted = "xxxxx"

// kvPassword finds password=… in a key/value connection string, quoted or
// not.
var kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]+)`)

// secrets returns the passwords that dsn and the environment carry, so that
// no message prints them.
func secrets(dsn string, getenv func(string) string) []string {
	var out []string
	if p := getenv("PGPASSWORD"); p != "" {
		out = append(out, p)
	}
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if p, ok := u.User.Password(); ok && p != "" {
			// Both as given and as it appears escaped in the URL.
			out = append(out, p, strings.TrimPrefix(url.UserPassword("", p).String(), ":"))
		}
		if p := u.Query().Get("password"); p != "" {
			out = append(out, p)
		}
		return out
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		p := strings.Trim(m[2], "'")
		if p != "" {
			out = append(out, p, m[2])
		}
	}
	return out
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
		if q := u.Query(); q.Has("password") {
			q.Set("password", redacted)
			u.RawQuery = q.Encode()
		}
		return strings.Replace(u.String(), url.QueryEscape(redacted), redacted, -1)
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
	shown   string // the DSN with the password redacted
	secrets []string
}

// clean wraps err so that its text carries no password.
func (d *database) clean(err error) error {
	if err == nil {
		return nil
	}
	return scrubbed{msg: scrub(err.Error(), d.secrets), err: err}
}

// open prepares the database named by -dsn or $DATABASE_URL without
// connecting to it.
func (c *command) open() (*database, error) {
	dsn := c.dsn
	if dsn == "" {
		dsn = c.e.getenv("DATABASE_URL")
	}
	if dsn == "" {
		return nil, usageError{"no database: give -dsn or set DATABASE_URL"}
	}
	d := &database{shown: redactDSN(dsn), secrets: secrets(dsn, c.e.getenv)}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return nil, usageError{d.clean(fmt.Errorf("bad connection string %s: %w", d.shown, err)).Error()}
	}
	db.SetMaxOpenConns(2)
	d.db = db
	return d, nil
}

// ping checks that the database answers within connectTimeout.
func (d *database) ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := d.db.PingContext(pctx); err != nil {
		return d.clean(fmt.Errorf("cannot reach the database at %s: %w", d.shown, err))
	}
	return nil
}
