// Package pgcluster makes throwaway PostgreSQL clusters for the tests and
// the soak: initdb into a temporary directory, a server on a port picked at
// run time, streaming standbys made with pg_basebackup, promotion, and the
// crashes an orchestrator has to live with. A cluster is never the
// machine's shared server.
//
// As root the cluster's files belong to, and its server runs as, the
// postgres OS user, since the server refuses to run as root.
package pgcluster

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

	"github.com/txclaim/idempotent/tests/internal/ports"
)

// ErrNoPostgres reports that no PostgreSQL server binaries (initdb and
// postgres) were found, so no throwaway cluster can be made.
var ErrNoPostgres = errors.New("no PostgreSQL server binaries (initdb, postgres)")

// FindBin returns the directory holding initdb and postgres: $IDEMPOTENT_PG_BIN,
// else the newest /usr/lib/postgresql/*/bin, else the directory of initdb
// on $PATH.
func FindBin() (string, error) {
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
			return "", fmt.Errorf("%w in IDEMPOTENT_PG_BIN=%s", ErrNoPostgres, dir)
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
	return "", fmt.Errorf("%w: install the postgresql package, or set IDEMPOTENT_PG_BIN", ErrNoPostgres)
}

// pgVersion extracts the major version from /usr/lib/postgresql/N/bin.
func pgVersion(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// Options shape a cluster.
type Options struct {
	// Parent is the directory the cluster's directory is made in. Default
	// is os.TempDir(). As root, Parent (and, up to os.TempDir(), the
	// directories above it) is made searchable by the postgres OS user.
	Parent string
	// Prefix starts the cluster directory's name. Default is "pgcluster-".
	Prefix string
	// TCP makes the server listen on 127.0.0.1:Port as well as on its Unix
	// socket, and DSN connect over TCP.
	TCP bool
}

// A Cluster is a throwaway PostgreSQL cluster in a temporary directory,
// listening on a Unix socket in that directory (and on 127.0.0.1 with
// Options.TCP).
type Cluster struct {
	Bin  string // the server binaries' directory
	Dir  string // temporary directory: data/, the socket, the log
	Port int
	TCP  bool

	cred *syscall.Credential // nil when not running as root
	log  *os.File

	cmd    *exec.Cmd
	exited chan struct{}
}

// New runs initdb into a fresh directory.
func New(ctx context.Context, bin string, opts Options) (*Cluster, error) {
	c, err := create(bin, opts)
	if err != nil {
		return nil, err
	}
	initdb := c.command(ctx, "initdb", "-D", c.DataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		c.Remove()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return c, nil
}

// NewStandby makes a streaming standby of the running primary with
// pg_basebackup -R. The standby is not started. Its walreceiver names
// itself appName (as synchronous_standby_names sees it) and connects to
// upstream (host:port on 127.0.0.1), which is the primary unless a test
// puts a proxy in between; "" means the primary.
func NewStandby(ctx context.Context, primary *Cluster, opts Options, appName, upstream string) (*Cluster, error) {
	c, err := create(primary.Bin, opts)
	if err != nil {
		return nil, err
	}
	bb := c.command(ctx, "pg_basebackup", "-D", c.DataDir(), "-h", primary.Dir, "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if out, err := bb.CombinedOutput(); err != nil {
		c.Remove()
		return nil, fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	host, port := primary.Dir, strconv.Itoa(primary.Port)
	if upstream != "" {
		h, p, err := net.SplitHostPort(upstream)
		if err != nil {
			c.Remove()
			return nil, fmt.Errorf("standby upstream %q: %w", upstream, err)
		}
		host, port = h, p
	}
	conninfo := fmt.Sprintf("host=%s port=%s user=postgres application_name=%s", host, port, appName)
	auto := fmt.Sprintf("primary_conninfo = '%s'\nwal_receiver_status_interval = 1s\nwal_retrieve_retry_interval = 100ms\n", conninfo)
	f, err := os.OpenFile(filepath.Join(c.DataDir(), "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(auto)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		c.Remove()
		return nil, fmt.Errorf("standby configuration: %w", err)
	}
	return c, nil
}

// create makes the cluster's directory, log and port.
func create(bin string, opts Options) (*Cluster, error) {
	c := &Cluster{Bin: bin, TCP: opts.TCP}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres OS user to run the server: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	base := opts.Parent
	if base == "" {
		base = os.TempDir()
	}
	if c.cred != nil && !searchable(base) {
		if opts.Parent != "" {
			openUpTo(base, os.TempDir())
		}
		if !searchable(base) {
			base = "/tmp" // the postgres OS user must reach the cluster's directory
		}
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "pgcluster-"
	}
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		return nil, err
	}
	c.Dir = dir
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			c.Remove()
			return nil, err
		}
	}
	if c.log, err = os.Create(filepath.Join(dir, "postgres.log")); err != nil {
		c.Remove()
		return nil, err
	}
	if c.Port, err = FreePort(); err != nil {
		c.Remove()
		return nil, err
	}
	return c, nil
}

// openUpTo adds search permission for everyone to dir and to the
// directories above it, stopping at top (a test's t.TempDir() is 0700).
func openUpTo(dir, top string) {
	top = filepath.Clean(top)
	for d := filepath.Clean(dir); strings.HasPrefix(d, top+string(filepath.Separator)); d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil {
			_ = os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
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

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return filepath.Join(c.Dir, "data") }

// command returns a command running one of the server binaries as the
// cluster's OS user.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Bin, name), args...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "HOME="+c.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	return cmd
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	p, err := ports.Free(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// Addr is the cluster's TCP address, 127.0.0.1:Port.
func (c *Cluster) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port)) }

// DSN returns a key=value connection string (lib/pq and pgx both read it)
// with the given application_name: over TCP with Options.TCP, else over
// the Unix socket.
func (c *Cluster) DSN(app string) string {
	host := c.Dir
	if c.TCP {
		host = "127.0.0.1"
	}
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5 application_name=%s", host, c.Port, app)
}

// Start starts the server with any extra settings ("name=value") and waits
// until it accepts connections. After an immediate shutdown or a kill this
// includes crash recovery; a standby accepts connections once consistent.
func (c *Cluster) Start(ctx context.Context, settings ...string) error {
	listen := ""
	if c.TCP {
		listen = "127.0.0.1"
	}
	args := []string{"-D", c.DataDir(), "-p", strconv.Itoa(c.Port),
		"-c", "listen_addresses=" + listen, "-c", "unix_socket_directories=" + c.Dir,
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=100",
		"-c", "shared_buffers=32MB", "-c", "log_min_messages=warning", "-c", "log_min_error_statement=panic"}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	cmd := c.command(context.Background(), "postgres", args...)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT // never outlive the test
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	c.cmd = cmd
	exited := make(chan struct{})
	c.exited = exited
	go func() { _ = cmd.Wait(); close(exited) }()

	db, err := sql.Open("postgres", c.DSN("pgcluster-probe"))
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
			return fmt.Errorf("postgres exited while starting: %s", c.LogTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within 60s: %w\n%s", err, c.LogTail())
		}
	}
}

// Promote promotes a standby with pg_ctl promote and waits until it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	cmd := c.command(ctx, "pg_ctl", "promote", "-w", "-t", "60", "-D", c.DataDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl promote: %w\n%s\n%s", err, out, c.LogTail())
	}
	return nil
}

// Crash stops the server with an immediate shutdown (SIGQUIT): every backend
// is killed at once and the next start runs crash recovery, as after a
// power cut of the server process.
func (c *Cluster) Crash() error { return c.signal(syscall.SIGQUIT, 30*time.Second) }

// Kill sends SIGKILL to the server's every process at once (the
// postmaster's process group), as when the node dies or an orchestrator
// fences it, and waits for the postmaster to exit. Nothing is flushed,
// nothing is sent to a client or a standby after the signal.
func (c *Cluster) Kill() error {
	if c.cmd == nil {
		return nil
	}
	if err := syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	select {
	case <-c.exited:
		c.cmd = nil
		return nil
	case <-time.After(30 * time.Second):
		return errors.New("postgres did not exit within 30s of SIGKILL")
	}
}

// Stop stops the server with a fast shutdown.
func (c *Cluster) Stop() error { return c.signal(syscall.SIGINT, 30*time.Second) }

func (c *Cluster) signal(sig syscall.Signal, within time.Duration) error {
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

// LogTail returns the end of the server log.
func (c *Cluster) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "postgres.log"))
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// Remove stops the server if it runs and deletes the cluster's directory.
func (c *Cluster) Remove() {
	_ = c.Stop()
	if c.log != nil {
		_ = c.log.Close()
	}
	_ = os.RemoveAll(c.Dir)
}
