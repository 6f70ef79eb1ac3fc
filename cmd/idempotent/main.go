// Command idempotent is the operator's tool for the claim table of
// github.com/txclaim/idempotent on Postgres, MySQL/MariaDB and SQLite.
//
// Usage:
//
//	idempotent schema     [-dialect postgres|mysql|sqlite] [-table T] [-partitioned] [-format sql|goose|golang-migrate-up|golang-migrate-down] [-kafka-offsets T]
//	idempotent migrate    [-dsn DSN] [-table T] [-partitioned] [-retention D] [-lead-days N] [-kafka-offsets T]
//	idempotent cleanup    [-dsn DSN] [-table T] -retention D [-consumer C] [-dry-run] [-batch N] …
//	idempotent partitions [-dsn DSN] [-table T] -retention D [-lead-days N] [-list]
//	idempotent stats      [-dsn DSN] [-table T]
//	idempotent kafka-offsets list  [-dsn DSN] [-table T] [-consumer C] [-topic T]
//	idempotent kafka-offsets reset [-dsn DSN] -table T -consumer C -topic T -partition N -offset M
//	idempotent dead-letters list    [-dsn DSN] [-table OUTBOX] [filter] [-after ID] [-limit N]
//	idempotent dead-letters show    [-dsn DSN] [-table OUTBOX] -id ID
//	idempotent dead-letters replay  [-dsn DSN] [-table OUTBOX] filter -by WHO [-dry-run]
//	idempotent dead-letters discard [-dsn DSN] [-table OUTBOX] filter -by WHO [-dry-run]
//	idempotent order gaps [-dsn DSN] [-table T] [-consumer C] [-older D]
//	idempotent order skip [-dsn DSN] [-table T] CONSUMER KEY SEQ
//	idempotent version
//
// The database comes from -dsn or, without it, the DATABASE_URL environment
// variable, and the connection string names the database:
//
//	postgres://… postgresql://… host=… dbname=…   Postgres (lib/pq)
//	mysql://user:pass@host:3306/db?params         MySQL or MariaDB (go-sql-driver/mysql;
//	user:pass@tcp(host:3306)/db?params              the port defaults to 3306)
//	sqlite:PATH, or a PATH ending in .db,         SQLite (modernc.org/sqlite), opened
//	.sqlite or .sqlite3                             with sqlite.DSN's settings
//
// A password in it is never printed, whatever its form, even when it does
// not parse. Only migrate creates an SQLite file that does not exist.
// Partitions are for Postgres and MySQL/MariaDB; the kafka offsets table and
// the outbox, where dead letters live, are Postgres only. A dead-letters
// filter is -consumer, -topic, -key, -reason, -from, -before and -ids. Durations take Go's units (90m, 36h) and days (30d,
// 1d12h). "idempotent COMMAND -h" lists a command's flags.
//
// An error is one line on standard error, "idempotent COMMAND: " and what
// went wrong. A database that does not answer is named for the reason:
// "authentication failed" (SQLSTATE 28P01 or 28000, MySQL error 1045), "no
// such database" (3D000, 1049), "not a Postgres server" or "not a MySQL or
// MariaDB server" (the connection opened but the server answered in another
// protocol, or not at all within 10 seconds), "cannot reach the database"
// (no connection opened: refused, no route, no such host), or "cannot
// connect to the database" with the driver's words for anything else.
//
// "idempotent version" (or -version, --version) prints the command's module
// version and the Go version it was built with.
//
// Exit status: 0 on success (including a cleanup that found another one
// running), 1 when the work failed or the database could not be reached, 2
// for bad flags or arguments.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal the default comes back: a second one ends the
	// process even while a driver ignores the cancelled context.
	context.AfterFunc(ctx, stop)
	// The MySQL driver logs what it also returns; a command's error is one
	// line.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	code := run(ctx, os.Args[1:], env{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr, terminal: isTerminal(os.Stdout)})
	stop()
	os.Exit(code)
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// env is what a command may touch of the outside world.
type env struct {
	getenv   func(string) string
	stdout   io.Writer
	stderr   io.Writer
	terminal bool // stdout is a terminal: show live progress
}

const usage = `idempotent manages the claim table of github.com/txclaim/idempotent on Postgres, MySQL/MariaDB and SQLite.

Usage: idempotent COMMAND [flags]

Commands:
  schema      print the claim table's DDL (plain SQL, goose or golang-migrate files), or the kafka offsets table's
  migrate     create the claim table (partitioned: and its day partitions) and, asked, the kafka offsets table, if missing
  cleanup     delete claims older than the retention window, in batches
  partitions  create the days ahead and drop the days past the retention window
  stats       claims per consumer, oldest and newest claim, sizes, partitions
  kafka-offsets list|reset
              the kafka consumer's stored offsets: list them, or reset one partition's deliberately
  dead-letters list|show|replay|discard
              the dead letters written through the outbox: list, show, replay or discard them, recorded
  order gaps|skip
              ordered consumers (WithOrdering): list the entities waiting in the parking table, or skip a gap
  version     the command's version and the Go version it was built with

The database is -dsn, or $DATABASE_URL: postgres://… or host=…, mysql://… or user:pass@tcp(host:3306)/db,
sqlite:PATH or PATH.db. Run "idempotent COMMAND -h" for a command's flags.
`

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(ctx context.Context, args []string, e env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return 2
	}
	cmds := map[string]func(context.Context, []string, env) error{
		"schema":        cmdSchema,
		"migrate":       cmdMigrate,
		"cleanup":       cmdCleanup,
		"partitions":    cmdPartitions,
		"stats":         cmdStats,
		"kafka-offsets": cmdKafkaOffsets,
		"dead-letters":  cmdDeadLetters,
		"order":         cmdOrder,
		"version":       cmdVersion,
	}
	name := args[0]
	if name == "-version" || name == "--version" {
		name = "version"
	}
	if name == "-h" || name == "-help" || name == "--help" || name == "help" {
		fmt.Fprint(e.stdout, usage)
		return 0
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(e.stderr, "idempotent: unknown command %q (want schema, migrate, cleanup, partitions, stats, kafka-offsets, dead-letters, order or version; run idempotent -h)\n", name)
		return 2
	}
	err := cmd(ctx, args[1:], e)
	switch err.(type) {
	case nil:
		return 0
	case usageError:
		fmt.Fprintf(e.stderr, "idempotent %s: %s (run idempotent %s -h)\n", name, message(err), name)
		return 2
	case helpShown:
		return 0
	}
	fmt.Fprintf(e.stderr, "idempotent %s: %s\n", name, message(err))
	return 1
}

// message is err's text on one line, without the library's own
// "idempotent: " prefix: the line already starts "idempotent COMMAND: ".
func message(err error) string {
	return strings.TrimPrefix(oneLine(err.Error()), "idempotent: ")
}

// oneLine folds a multi-line message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
