package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/lib/pq" // the "postgres" database/sql driver
)

// errNoPostgres reports that no PostgreSQL server binaries (initdb and
// postgres) were found, so no throwaway cluster can be made.
var errNoPostgres = errors.New("no PostgreSQL server binaries (initdb, postgres)")

// findPGBin returns the directory holding initdb and postgres: $IDEMPOTENT_PG_BIN,
// else the newest /usr/lib/postgresql/*/bin, else the directory of initdb
// on $PATH.
func findPGBin() (string, error) {
	usable := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("IDEMPOTENT_PG_BIN"); dir != "" {
		if !usable(dir) {
			return "", fmt.Errorf("%w in IDEMPOTENT_PG_BIN=%s", errNoPostgres, dir)
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) < pgVersion(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if usable(dirs[i]) {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && usable(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("%w: install the postgresql package, or set IDEMPOTENT_PG_BIN", errNoPostgres)
}

// pgVersion extracts the major version from /usr/lib/postgresql/N/bin.
func pgVersion(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// cluster is a throwaway PostgreSQL cluster in a temporary directory,
// listening only on a Unix socket in that directory. It is never the
// machine's shared server.
type cluster struct {
	bin  string
	dir  string // temporary directory: data/, the socket, the log
	port int
	cred *syscall.Credential // nil when not running as root
	log  *os.File

	cmd    *exec.Cmd
	exited chan struct{}
}

// newCluster runs initdb into a fresh temporary directory. As root, the
// cluster's files belong to, and its server runs as, the postgres OS user,
// since the server refuses to run as root.
func newCluster(ctx context.Context, bin string) (*cluster, error) {
	c := &cluster{bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres OS user to run the server: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	base := os.TempDir()
	if c.cred != nil && !searchable(base) {
		base = "/tmp" // the postgres OS user must reach the cluster's directory
	}
	dir, err := os.MkdirTemp(base, "idempotent-soak-")
	if err != nil {
		return nil, err
	}
	c.dir = dir
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			c.remove()
			return nil, err
		}
	}
	if c.log, err = os.Create(filepath.Join(dir, "postgres.log")); err != nil {
		c.remove()
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		c.remove()
		return nil, err
	}
	c.port = port
	initdb := c.command(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		c.remove()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return c, nil
}

// searchable reports whether every directory on the way to dir lets any
// user through.
func searchable(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

func (c *cluster) dataDir() string { return filepath.Join(c.dir, "data") }

// command returns a command running one of the server binaries as the
// cluster's OS user.
func (c *cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "HOME="+c.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	return cmd
}

// freePort returns a TCP port that was free a moment ago. The cluster
// listens only on its Unix socket, whose file name carries the port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// dsn returns a lib/pq connection string for the cluster's socket, with the
// given application_name (the fault injector picks its targets by it).
func (c *cluster) dsn(app string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5 application_name=%s", c.dir, c.port, app)
}

// start starts the server and waits until it accepts connections. After an
// immediate shutdown this includes crash recovery.
func (c *cluster) start(ctx context.Context) error {
	cmd := c.command(context.Background(), "postgres", "-D", c.dataDir(), "-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=", "-c", "unix_socket_directories="+c.dir,
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=100",
		"-c", "shared_buffers=32MB", "-c", "log_min_messages=warning", "-c", "log_min_error_statement=panic")
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT // never outlive the soak
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	c.cmd = cmd
	exited := make(chan struct{})
	c.exited = exited
	go func() { _ = cmd.Wait(); close(exited) }()

	db, err := sql.Open("postgres", c.dsn("soak-probe"))
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = db.PingContext(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited while starting: %s", c.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within 60s: %w\n%s", err, c.logTail())
		}
	}
}

// crash stops the server with an immediate shutdown (SIGQUIT): every backend
// is killed at once and the next start runs crash recovery, as after a
// power cut of the server process.
func (c *cluster) crash() error { return c.signal(syscall.SIGQUIT, 30*time.Second) }

// stop stops the server with a fast shutdown.
func (c *cluster) stop() error { return c.signal(syscall.SIGINT, 30*time.Second) }

func (c *cluster) signal(sig syscall.Signal, within time.Duration) error {
	if c.cmd == nil {
		return nil
	}
	select {
	case <-c.exited:
		c.cmd = nil
		return nil
	default:
	}
	if err := c.cmd.Process.Signal(sig); err != nil {
		return err
	}
	select {
	case <-c.exited:
		c.cmd = nil
		return nil
	case <-time.After(within):
		_ = c.cmd.Process.Kill()
		<-c.exited
		c.cmd = nil
		return fmt.Errorf("postgres did not stop within %v after %v", within, sig)
	}
}

// logTail returns the end of the server log.
func (c *cluster) logTail() string {
	b, _ := os.ReadFile(c.log.Name())
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// remove stops the server if it runs and deletes the temporary directory.
func (c *cluster) remove() {
	_ = c.stop()
	if c.log != nil {
		_ = c.log.Close()
	}
	_ = os.RemoveAll(c.dir)
}
