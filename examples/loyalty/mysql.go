//go:build loyalty_mysql

package main

import (
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"

	mysqldriver "github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
)

// The MySQL and MariaDB part: -db user:pass@tcp(host:3306)/db, optionally
// prefixed mysql://.
func init() {
	// The driver logs what it also returns; the demo's errors are one line.
	_ = mysqldriver.SetLogger(log.New(io.Discard, "", 0))
	databases["mysql"] = database{
		parse: func(dsn string) (target, error) {
			dsn = strings.TrimPrefix(dsn, "mysql://")
			cfg, err := mysqldriver.ParseDSN(dsn)
			if err != nil {
				return target{}, fmt.Errorf("-db %s: not a MySQL DSN: %w", shownDSN(dsn), err)
			}
			// What stands between the first ':' and the last '@' may be
			// the password, whatever the driver made of it.
			shown := strings.Trim(shownDSN(dsn), `"`)
			desc := "MySQL (" + shown + ")"
			if cfg.Net == "tcp" {
				// The driver leaves the port to the dialer, whose error
				// reads as a server that does not answer.
				if _, port, err := net.SplitHostPort(cfg.Addr); err != nil {
					return target{}, fmt.Errorf("-db %s: not a MySQL DSN: the address is not host:port", shown)
				} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
					return target{}, fmt.Errorf("-db %s: not a MySQL DSN: the port is not a number from 1 to 65535", shown)
				}
			}
			return target{kind: "mysql", dsn: dsn, desc: desc}, nil
		},
		open: func(t target) (*sql.DB, dialect.Dialect, error) {
			cfg, err := mysqldriver.ParseDSN(t.dsn)
			if err != nil {
				return nil, nil, err
			}
			c, err := mysqldriver.NewConnector(cfg)
			if err != nil {
				return nil, nil, err
			}
			return sql.OpenDB(c), mysql.New(), nil
		},
		pingError: func(desc string, err error) error {
			var my *mysqldriver.MySQLError
			if errors.As(err, &my) {
				switch my.Number {
				case 1045:
					return fmt.Errorf("database %s: authentication failed: %w", desc, err)
				case 1044, 1049:
					return fmt.Errorf("database %s: no such database, or none this user may use: %w", desc, err)
				}
			}
			return fmt.Errorf("database %s does not answer: %w", desc, err)
		},
		horizon: mysql.HorizonName,
	}
}
