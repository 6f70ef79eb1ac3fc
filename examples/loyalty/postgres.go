//go:build loyalty_postgres

package main

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// The Postgres part: -db postgres://…, and -broker kafka's database.
func init() {
	databases["postgres"] = database{
		parse: func(dsn string) (target, error) {
			// lib/pq takes only a lower-case scheme for a URL, and anything
			// else for key=value pairs.
			scheme, rest, _ := strings.Cut(dsn, "://")
			dsn = strings.ToLower(scheme) + "://" + rest
			u, err := url.Parse(dsn)
			if err != nil {
				return target{}, fmt.Errorf("-db: not a Postgres URL: %s", urlProblem(err))
			}
			shown := shownURL(u)
			if _, err := pq.NewConnector(dsn); err != nil {
				return target{}, fmt.Errorf("-db %s: not a Postgres URL: %s", shown, scrubbed(err, u))
			}
			return target{kind: "postgres", dsn: dsn, desc: "Postgres (" + strings.Trim(shown, `"`) + ")"}, nil
		},
		open: func(t target) (*sql.DB, dialect.Dialect, error) {
			c, err := pq.NewConnector(t.dsn)
			if err != nil {
				return nil, nil, err
			}
			return sql.OpenDB(c), postgres.New(), nil
		},
		pingError: func(desc string, err error) error {
			var state interface{ SQLState() string }
			if errors.As(err, &state) {
				switch state.SQLState() {
				case "28P01", "28000":
					return fmt.Errorf("database %s: authentication failed: %w", desc, err)
				case "3D000":
					return fmt.Errorf("database %s: no such database: %w", desc, err)
				}
			}
			return fmt.Errorf("database %s does not answer: %w", desc, err)
		},
		horizon: postgres.HorizonName,
	}
}

// scrubbed is err's text without u's passwords, which a driver's error may
// quote.
func scrubbed(err error, u *url.URL) string {
	msg := err.Error()
	if p, ok := u.User.Password(); ok && p != "" {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	for k, vs := range u.Query() {
		if strings.EqualFold(k, "password") {
			for _, p := range vs {
				if p != "" {
					msg = strings.ReplaceAll(msg, p, "xxxxx")
				}
			}
		}
	}
	return msg
}
