package pgcluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoPgBouncer reports that no pgbouncer binary was found.
var ErrNoPgBouncer = errors.New("no pgbouncer binary")

// FindPgBouncer returns the pgbouncer binary: $IDEMPOTENT_PGBOUNCER, else
// pgbouncer on $PATH, else /usr/sbin/pgbouncer (Debian's package).
func FindPgBouncer() (string, error) {
	if p := os.Getenv("IDEMPOTENT_PGBOUNCER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w at IDEMPOTENT_PGBOUNCER=%s: %v", ErrNoPgBouncer, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("%w: install the pgbouncer package (apt-get install -y pgbouncer), or set IDEMPOTENT_PGBOUNCER", ErrNoPgBouncer)
}

// PgBouncerOptions configure a throwaway PgBouncer.
type PgBouncerOptions struct {
	// Bin is the pgbouncer binary (see FindPgBouncer).
	Bin string
	// Parent is the directory its ini, auth file and log are made in.
	// Default is os.TempDir().
	Parent string
	// Host, Port, Database and User are the server it pools for and the
	// role the clients log in as (trust authentication, as on the test
	// server).
	Host     string
	Port     int
	Database string
	User     string
	// PoolMode is "transaction" (the default), "session" or "statement".
	PoolMode string
	// PoolSize is default_pool_size, and max_db_connections. Default 40.
	PoolSize int
}

// PgBouncer is a pgbouncer process of a test's own, listening on
// 127.0.0.1:Port.
type PgBouncer struct {
	Dir  string
	Port int

	user, database string
	cmd            *exec.Cmd
	exited         chan struct{}
}

// StartPgBouncer writes an ini and an auth file, starts pgbouncer (as the
// postgres OS user when running as root: pgbouncer refuses to run as root)
// and waits until a query passes through it.
func StartPgBouncer(ctx context.Context, opts PgBouncerOptions) (*PgBouncer, error) {
	if opts.PoolMode == "" {
		opts.PoolMode = "transaction"
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 40
	}
	c, err := create("", Options{Parent: opts.Parent, Prefix: "pgbouncer-"})
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{Dir: c.Dir, Port: c.Port, user: opts.User, database: opts.Database}
	_ = c.log.Close()
	auth := filepath.Join(b.Dir, "userlist.txt")
	ini := filepath.Join(b.Dir, "pgbouncer.ini")
	files := map[string]string{
		auth: fmt.Sprintf("%q \"\"\n", opts.User),
		ini: fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_db_connections = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
admin_users = %s
stats_period = 1
log_connections = 0
log_disconnections = 0
`, opts.Database, opts.Host, opts.Port, opts.Database, b.Port, auth, opts.PoolMode, opts.PoolSize, opts.PoolSize,
			filepath.Join(b.Dir, "pgbouncer.log"), filepath.Join(b.Dir, "pgbouncer.pid"), opts.User),
	}
	for name, text := range files {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			c.Remove()
			return nil, err
		}
		if c.cred != nil {
			_ = os.Chown(name, int(c.cred.Uid), int(c.cred.Gid))
		}
	}
	cmd := exec.Command(opts.Bin, ini)
	cmd.Dir = b.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(b.Dir, "stderr.log"))
	if err != nil {
		c.Remove()
		return nil, err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		c.Remove()
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	b.cmd = cmd
	b.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(b.exited) }()

	db, err := sql.Open("postgres", b.DSN(""))
	if err != nil {
		b.Stop()
		return nil, err
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var one int
		err = db.QueryRowContext(pctx, "SELECT 1").Scan(&one)
		cancel()
		if err == nil {
			return b, nil
		}
		select {
		case <-b.exited:
			log := b.LogTail()
			_ = os.RemoveAll(b.Dir)
			return nil, fmt.Errorf("pgbouncer exited while starting: %s", log)
		case <-ctx.Done():
			b.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log := b.LogTail()
			b.Stop()
			return nil, fmt.Errorf("pgbouncer did not pass a query within 30s: %w\n%s", err, log)
		}
	}
}

// DSN returns a URL connection string through the pooler to the database,
// with extra query parameters (such as "binary_parameters=yes") appended.
func (b *PgBouncer) DSN(params string) string {
	u := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", b.user, b.Port, b.database)
	if params != "" {
		u += "&" + params
	}
	return u
}

// Transactions returns how many transactions PgBouncer has passed to the
// pooled database so far (SHOW STATS' total_xact_count, from its admin
// console).
func (b *PgBouncer) Transactions(ctx context.Context) (int64, error) {
	db, err := sql.Open("postgres", fmt.Sprintf("postgres://%s@127.0.0.1:%d/pgbouncer?sslmode=disable", b.user, b.Port))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "SHOW STATS")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return 0, err
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = fmt.Sprint(asString(vals[i]))
		}
		if row["database"] == b.database {
			return strconv.ParseInt(row["total_xact_count"], 10, 64)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("SHOW STATS has no row for %s", b.database)
}

func asString(v any) any {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return v
}

// LogTail returns the end of pgbouncer's log and standard error.
func (b *PgBouncer) LogTail() string {
	var all []byte
	for _, f := range []string{"stderr.log", "pgbouncer.log"} {
		data, _ := os.ReadFile(filepath.Join(b.Dir, f))
		all = append(all, data...)
	}
	const n = 2000
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return strings.TrimSpace(string(all))
}

// Stop stops pgbouncer (SIGINT: a fast shutdown) and removes its directory.
func (b *PgBouncer) Stop() {
	if b.cmd != nil {
		_ = b.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-b.exited:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
		b.cmd = nil
	}
	_ = os.RemoveAll(b.Dir)
}
