package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// The pre-check against a MariaDB server restarted and a data directory
// copied back, on a throwaway server of the test's own (mariadb-install-db
// into a temporary directory, mariadbd on a port and socket of its own),
// never the shared one.

// mariadbBinaries returns mariadb-install-db and the server binary,
// skipping the test when they are missing (failing it under CI).
func mariadbBinaries(t *testing.T) (install, server string) {
	t.Helper()
	if testing.Short() {
		t.Skip("a throwaway MariaDB server: skipped in -short mode")
	}
	find := func(names ...string) string {
		for _, n := range names {
			if p, err := exec.LookPath(n); err == nil {
				return p
			}
			if p := filepath.Join("/usr/sbin", n); fileExists(p) {
				return p
			}
		}
		return ""
	}
	install, server = find("mariadb-install-db"), find("mariadbd", "mysqld")
	if install == "" || server == "" {
		testenv.Unavailable(t, "a throwaway MariaDB server needs mariadb-install-db and mariadbd (apt-get install mariadb-server); found %q and %q", install, server)
	}
	return install, server
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// mariadbServer is a throwaway MariaDB server: its data directory in dir,
// listening on 127.0.0.1:port and on a socket in dir, with grant tables
// skipped (any user, no password).
type mariadbServer struct {
	bin, dir string
	port     int
	cmd      *exec.Cmd
	exited   chan struct{}
}

// newMariaDB initializes a data directory in a temporary directory and
// starts the server on it, stopped in Cleanup.
func newMariaDB(t *testing.T) *mariadbServer {
	t.Helper()
	install, bin := mariadbBinaries(t)
	port, err := pgcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &mariadbServer{bin: bin, dir: t.TempDir(), port: port}
	args := []string{"--no-defaults", "--datadir=" + s.dataDir(), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	})
	s.start(t)
	if _, err := s.open(t, "").Exec("CREATE DATABASE test"); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *mariadbServer) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *mariadbServer) dsn(database string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", s.port, database)
}

// open opens a pool on database ("" for none), closed in Cleanup.
func (s *mariadbServer) open(t *testing.T, database string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", s.dsn(database))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// start starts the server and waits until it answers a query.
func (s *mariadbServer) start(t *testing.T) {
	t.Helper()
	args := []string{"--no-defaults", "--datadir=" + s.dataDir(), fmt.Sprintf("--port=%d", s.port), "--bind-address=127.0.0.1",
		"--socket=" + filepath.Join(s.dir, "sock"), "--pid-file=" + filepath.Join(s.dir, "pid"),
		"--log-error=" + filepath.Join(s.dir, "error.log"), "--skip-grant-tables", "--skip-log-bin",
		"--innodb-buffer-pool-size=16M", "--innodb-log-file-size=16M"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mariadbd: %v", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	exited := s.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	db, err := sql.Open("mysql", s.dsn(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(60 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("mariadbd exited while starting: %s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("mariadbd did not answer within 60s: %v\n%s", err, s.logTail())
		}
	}
}

// stop shuts the server down (SIGTERM: a clean shutdown) and waits for it.
func (s *mariadbServer) stop() error {
	if s.cmd == nil {
		return nil
	}
	defer func() { s.cmd = nil }()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("mariadbd did not stop within 60s: %s", s.logTail())
	}
}

func (s *mariadbServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "error.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// waitUptime waits until the server has run for a second: a server
// started after it starts in a later second.
func (s *mariadbServer) waitUptime(t *testing.T, db *sql.DB) {
	t.Helper()
	waitFor(t, "the server's Uptime to reach 1s", func() (bool, error) {
		var name string
		var up int64
		err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Uptime'").Scan(&name, &up)
		return up >= 1, err
	})
}

// mariadbApp is one process of a consumer on a throwaway MariaDB.
type mariadbApp struct {
	t     *testing.T
	where string
	db    *sql.DB
	mw    *idempotent.Middleware
	clock *seenClock
}

func newMariaDBApp(t *testing.T, where string, s *mariadbServer, seen idempotent.Seen, clock *seenClock) *mariadbApp {
	t.Helper()
	a := &mariadbApp{t: t, where: where, db: s.open(t, "test"), clock: clock}
	if _, err := a.db.Exec("CREATE TABLE IF NOT EXISTS effects (id VARCHAR(100) PRIMARY KEY, n INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var err error
	if a.mw, err = idempotent.New(a.db, mysql.New(), "orders", idempotent.WithSeen(seen),
		idempotent.WithClock(clock.Now), idempotent.WithRetry(seenRetry)); err != nil {
		t.Fatal(err)
	}
	if err := a.mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *mariadbApp) expect(want idempotent.Outcome, keys ...string) {
	a.t.Helper()
	for _, k := range keys {
		out, err := a.mw.ProcessMessage(context.Background(), idempotent.Message{Key: k}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO effects (id, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1", k)
			return err
		})
		if err != nil {
			a.t.Errorf("%s's delivery of %s: %v", a.where, k, err)
		} else if out != want {
			a.t.Errorf("%s's delivery of %s: %v, want %v", a.where, k, out, want)
		}
	}
}

func (a *mariadbApp) wantOnce(keys ...string) {
	a.t.Helper()
	for _, k := range keys {
		var n int
		if err := a.db.QueryRow("SELECT COALESCE((SELECT n FROM effects WHERE id = ?), 0)", k).Scan(&n); err != nil {
			a.t.Fatal(err)
		}
		if n != 1 {
			a.t.Errorf("%s: effect applied %d times in %s, want once", k, n, a.where)
		}
	}
}

func (a *mariadbApp) scope() idempotent.SeenScope {
	a.t.Helper()
	s, err := a.mw.SeenScope(context.Background())
	if err != nil {
		a.t.Fatalf("%s: SeenScope: %v", a.where, err)
	}
	return s
}

// TestSeenMariaDBRestart: a restart of the server gives a new scope — the
// pre-check is cold after it — to a process started after it, and to the
// process that ran on through it once the scope it read is 5 seconds old.
func TestSeenMariaDBRestart(t *testing.T) {
	s := newMariaDB(t)
	lru := newLRU(t)
	app := newMariaDBApp(t, "the server", s, lru, newSeenClock())
	app.expect(idempotent.Applied, "before")
	before := app.scope()
	s.waitUptime(t, app.db)
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	fresh := newMariaDBApp(t, "the restarted server", s, lru, newSeenClock())
	after := fresh.scope()
	t.Logf("before the restart: %s\nafter it:           %s", before.Database, after.Database)
	if after == before {
		t.Errorf("a process started after the restart reads the scope of before it: %q", after.Database)
	}
	app.clock.Add(scopeAge)
	if running := app.scope(); running != after {
		t.Errorf("the process that ran on reads %q once its scope is %v old, want %q", running.Database, scopeAge, after.Database)
	}
	fresh.expect(idempotent.Duplicate, "before")
	fresh.wantOnce("before")
}

// TestSeenMariaDBDataDirectoryRestored: the data directory of the stopped
// server copied aside (a cold physical backup), the server started again
// and a message applied, then the copy put back and started. The message
// is applied again: by a process started after the restore, and by the
// process that ran on through it once the scope it read is 5 seconds old.
func TestSeenMariaDBDataDirectoryRestored(t *testing.T) {
	s := newMariaDB(t)
	lru := newLRU(t)
	app := newMariaDBApp(t, "production", s, lru, newSeenClock())
	app.expect(idempotent.Applied, "kept")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(s.dir, "backup")
	if out, err := exec.Command("cp", "-a", s.dataDir(), backup).CombinedOutput(); err != nil {
		t.Fatalf("copy the data directory: %v\n%s", err, out)
	}
	s.start(t)
	app.expect(idempotent.Applied, "lost", "lost-running") // lost with the restore
	before := app.scope()
	s.waitUptime(t, app.db)
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(s.dataDir()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, s.dataDir()); err != nil {
		t.Fatal(err)
	}
	s.start(t)

	fresh := newMariaDBApp(t, "the restored database", s, lru, newSeenClock())
	fresh.expect(idempotent.Applied, "lost")
	fresh.expect(idempotent.Duplicate, "kept")
	app.where = "the restored database (a process that ran on)"
	app.clock.Add(scopeAge)
	app.expect(idempotent.Applied, "lost-running")
	fresh.wantOnce("kept", "lost", "lost-running")
	t.Logf("before the restore: %s\nafter it:           %s", before.Database, fresh.scope().Database)
}
