package main

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/internal/testenv"
)

// sqlState is a driver error with a SQLSTATE, as lib/pq's and pgx's are.
type sqlState string

func (s sqlState) Error() string    { return "server says " + string(s) }
func (s sqlState) SQLState() string { return string(s) }

// The label of a failed first contact comes from the driver's error value,
// never from its text.
func TestPingErrorLabels(t *testing.T) {
	connected := &probe{}
	connected.opened.Store(true)
	connected.addr.Store("db:5432")
	for _, c := range []struct {
		kind string
		p    *probe
		err  error
		want string
	}{
		{kindPostgres, connected, sqlState("28P01"), "authentication failed at SHOWN: "},
		{kindPostgres, connected, fmt.Errorf("wrapped: %w", sqlState("28000")), "authentication failed at SHOWN: "},
		{kindMySQL, connected, &mysql.MySQLError{Number: 1045, Message: "Access denied"}, "authentication failed at SHOWN: "},
		{kindPostgres, connected, sqlState("3D000"), "no such database at SHOWN: "},
		{kindMySQL, connected, &mysql.MySQLError{Number: 1049}, "no such database at SHOWN: "},
		{kindPostgres, &probe{}, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, "cannot reach the database at SHOWN: "},
		{kindMySQL, &probe{}, fmt.Errorf("%w: %w", errNoAnswer, errors.New("deadline")), "cannot reach the database at SHOWN: "},
		{kindPostgres, connected, fmt.Errorf("%w: x", errNoAnswer), "not a Postgres server at db:5432, or one too busy to answer"},
		{kindMySQL, connected, fmt.Errorf("%w: x", errNoAnswer), "not a MySQL or MariaDB server at db:5432, or one too busy to answer"},
		{kindPostgres, connected, errors.New(`pq: unknown response for startup: "H"`), "not a Postgres server at db:5432: it answered in another protocol (SHOWN)"},
		{kindMySQL, connected, mysql.ErrPktSync, "not a MySQL or MariaDB server at db:5432: it answered in another protocol (SHOWN)"},
		{kindPostgres, connected, sqlState("53300"), "cannot connect to the database at SHOWN: "},
		{kindMySQL, connected, mysql.ErrInvalidConn, "cannot connect to the database at SHOWN: "},
		{kindSQLite, &probe{}, errors.New("locked"), "cannot open the SQLite database at SHOWN: "},
	} {
		d := &database{target: target{kind: c.kind}, shown: "SHOWN", probe: c.p}
		got := d.pingError(c.err)
		if !strings.HasPrefix(got.Error(), c.want) || !errors.Is(got, c.err) {
			t.Errorf("%s, %v: %q; want it to start %q and wrap the driver's error", c.kind, c.err, got, c.want)
		}
	}
}

// listen starts a server on loopback that, for each connection, writes
// greeting (nothing when it is "") and then stays silent until the test
// ends. It returns its port.
func listen(t *testing.T, greeting string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if greeting != "" {
					_, _ = c.Write([]byte(greeting))
				}
				<-done
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// dsnForms is the connection string of each form that reaches the network,
// for host 127.0.0.1, port, user, password and database test.
func dsnForms(port, user, password string) map[string]string {
	return map[string]string{
		"postgres URL": fmt.Sprintf("postgres://%s:%s@127.0.0.1:%s/test?sslmode=disable", user, password, port),
		"key/value":    fmt.Sprintf("host=127.0.0.1 port=%s user=%s password=%s dbname=test sslmode=disable", port, user, password),
		"mysql URL":    fmt.Sprintf("mysql://%s:%s@127.0.0.1:%s/test", user, password, port),
		"mysql native": fmt.Sprintf("%s:%s@tcp(127.0.0.1:%s)/test", user, password, port),
	}
}

// A server of another protocol, or one that never answers, is named as not
// the database the DSN asks for, on every form of DSN, and the password is
// never printed.
func TestNotTheDatabaseTheDSNNames(t *testing.T) {
	old := connectTimeout
	connectTimeout = 300 * time.Millisecond // the silent server's wait
	t.Cleanup(func() { connectTimeout = old })
	silent := listen(t, "")
	// A whole frame that is not the handshake: a Postgres message of type
	// 'd' (CopyData) out of turn; a MySQL packet whose sequence number is not 0.
	pgFrame, myFrame := listen(t, "d\x00\x00\x00\x04"), listen(t, "\x01\x00\x00\x07\x0a")
	for _, c := range []struct {
		pg, my bool
		port   string
		want   string
	}{
		{true, true, silent, "or one too busy to answer"},
		{true, false, pgFrame, "it answered in another protocol"},
		{false, true, myFrame, "it answered in another protocol"},
	} {
		for form, dsn := range dsnForms(c.port, "bob", "Pa55w0rdX") {
			server := "Postgres"
			if strings.HasPrefix(form, "mysql") {
				server = "MySQL or MariaDB"
			}
			if server == "Postgres" && !c.pg || server != "Postgres" && !c.my {
				continue
			}
			want := "idempotent stats: not a " + server + " server at 127.0.0.1:" + c.port
			code, stdout, stderr := runCLI(t, nil, "stats", "-dsn", dsn)
			if code != 1 || !strings.HasPrefix(stderr, want) || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%s %s: exit %d, stderr %q; want exit 1 and one line starting %q with %q", form, dsn, code, stderr, want, c.want)
			}
			if strings.Contains(stdout+stderr, "Pa55w0rdX") {
				t.Errorf("%s: password printed: %q %q", form, stdout, stderr)
			}
		}
	}
}

// Against the real servers, on every form of DSN: a user the server refuses
// is "authentication failed", a Postgres DSN at MariaDB's port is "not a
// Postgres server"; the password is never printed.
func TestRealServersNameTheProblem(t *testing.T) {
	for _, c := range []struct{ form, port, want string }{
		{"postgres URL", "5432", "authentication failed at "},
		{"key/value", "5432", "authentication failed at "},
		{"mysql URL", "3306", "authentication failed at "},
		{"mysql native", "3306", "authentication failed at "},
		{"postgres URL", "3306", "not a Postgres server at 127.0.0.1:3306: it answered in another protocol"},
		{"key/value", "3306", "not a Postgres server at 127.0.0.1:3306: it answered in another protocol"},
	} {
		form := c.form
		if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+c.port, 5*time.Second); err != nil {
			testenv.Unavailable(t, "no database at 127.0.0.1:%s: %v", c.port, err)
		} else {
			_ = conn.Close()
		}
		dsn := dsnForms(c.port, "no_such_user_cli", "Pa55w0rdX")[form]
		code, stdout, stderr := runCLI(t, nil, "stats", "-dsn", dsn)
		if code != 1 || !strings.HasPrefix(stderr, "idempotent stats: "+c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s at %s: exit %d, stderr %q; want exit 1 and one line: %s", form, c.port, code, stderr, c.want)
		}
		if strings.Contains(stdout+stderr, "Pa55w0rdX") {
			t.Errorf("%s: password printed: %q %q", form, stdout, stderr)
		}
	}
}

// A library error already says "idempotent: "; the line says it once.
func TestNoStutteredPrefix(t *testing.T) {
	for err, want := range map[error]string{
		errors.New("idempotent: MaintainPartitions: claim table t is not partitioned"): "MaintainPartitions: claim table t is not partitioned",
		fmt.Errorf("count: %w", errors.New("idempotent: x")):                           "count: idempotent: x",
		errors.New("idempotent: idempotent: x"):                                        "idempotent: x",
	} {
		if got := message(err); got != want {
			t.Errorf("message(%q) = %q, want %q", err, got, want)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Cleanup(func() { readBuildInfo = debug.ReadBuildInfo })
	for _, c := range []struct {
		info *debug.BuildInfo
		want string
	}{
		{nil, "idempotent devel " + runtime.Version() + " "},
		{&debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}}, "idempotent devel go1.26.1 "},
		{&debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v1.2.0"}}, "idempotent v1.2.0 go1.26.1 "},
	} {
		readBuildInfo = func() (*debug.BuildInfo, bool) { return c.info, c.info != nil }
		for _, arg := range []string{"version", "-version", "--version"} {
			code, stdout, stderr := runCLI(t, nil, arg)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, c.want) || !strings.HasSuffix(stdout, runtime.GOOS+"/"+runtime.GOARCH+"\n") {
				t.Errorf("%s with %+v: exit %d, stdout %q, stderr %q; want %q…", arg, c.info, code, stdout, stderr, c.want)
			}
		}
	}
}
