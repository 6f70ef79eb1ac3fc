// Package tests holds the integration tests, which run against a real
// Postgres (and, for other dialects, the real servers).
//
// The database comes from IDEMPOTENT_POSTGRES_DSN. Without it, a postgres:16
// container is started with dockertest where a Docker engine answers, and
// otherwise the local server at postgres://postgres@127.0.0.1:5432/test is
// tried. If none is reachable the tests skip, saying how to run them — except
// when CI is set, where they fail.
package tests

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

const localDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

var (
	pgDSN      string // the DSN every test connects to; "" when none
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dsn, cleanup, why := findPostgres()
	defer cleanup()
	defer stopSharedGalera()
	pgDSN, skipReason = dsn, why
	if pgDSN == "" && os.Getenv("CI") != "" {
		log.Printf("integration tests need Postgres and CI is set: %s", skipReason)
		return 1
	}
	return m.Run()
}

// findPostgres returns a DSN and a cleanup function, or a reason there is no
// database.
func findPostgres() (dsn string, cleanup func(), why string) {
	cleanup = func() {}
	if dsn := os.Getenv("IDEMPOTENT_POSTGRES_DSN"); dsn != "" {
		if err := ping(dsn, 10*time.Second); err != nil {
			return "", cleanup, fmt.Sprintf("IDEMPOTENT_POSTGRES_DSN is set but does not answer: %v", err)
		}
		return dsn, cleanup, ""
	}
	if dsn, purge, err := startContainer(); err == nil {
		return dsn, purge, ""
	} else if err2 := ping(localDSN, 3*time.Second); err2 == nil {
		return localDSN, cleanup, ""
	} else {
		return "", cleanup, fmt.Sprintf("no database: set IDEMPOTENT_POSTGRES_DSN (for example %s), or run a Docker engine (dockertest: %v; local server: %v)", localDSN, err, err2)
	}
}

func ping(dsn string, within time.Duration) error {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return db.PingContext(ctx)
}

// startContainer runs postgres:16 with dockertest and returns its DSN and a
// purge function. It fails fast when no Docker engine answers.
func startContainer() (string, func(), error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return "", nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return "", nil, fmt.Errorf("no Docker engine: %w", err)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres", Tag: "16",
		Env: []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return "", nil, err
	}
	purge := func() { _ = pool.Purge(res) }
	_ = res.Expire(600)
	dsn := fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable", res.GetHostPort("5432/tcp"))
	pool.MaxWait = 2 * time.Minute
	if err := pool.Retry(func() error { return ping(dsn, 5*time.Second) }); err != nil {
		purge()
		return "", nil, err
	}
	return dsn, purge, nil
}

// openDB returns a database for the test, closed in Cleanup after checking
// that no connection leaked. It skips the test when there is no database.
func openDB(t testing.TB) *sql.DB {
	t.Helper()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	db, err := sql.Open("postgres", routedDSN(t, "pq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	return db
}

// closeChecked fails the test if db still has a connection in use, then
// closes it.
func closeChecked(t testing.TB, db *sql.DB) {
	t.Helper()
	if n := db.Stats().InUse; n != 0 {
		t.Errorf("connection leak: %d connections still in use", n)
	}
	_ = db.Close()
}

// uniqueName returns a fresh identifier with the given prefix.
func uniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// tempSchema creates a schema of the test's own, dropped in Cleanup, and
// returns its name.
func tempSchema(t testing.TB, db *sql.DB) string {
	t.Helper()
	name := uniqueName("t")
	if _, err := db.Exec("CREATE SCHEMA " + pq.QuoteIdentifier(name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("DROP SCHEMA " + pq.QuoteIdentifier(name) + " CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}
