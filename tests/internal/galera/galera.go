// Package galera starts throwaway three-node MariaDB Galera clusters on
// loopback ports for the tests: each node with its own data directory,
// ports and socket, node 1 bootstrapping the cluster (--wsrep-new-cluster)
// and nodes 2 and 3 joining it by state snapshot transfer (rsync). When the
// Galera provider is missing and the process runs as root, Start installs
// it (apt-get install galera-4 rsync), as scripts/services.sh installs the
// servers.
//
// The nodes run as the mysql user when the process is root: the rsync
// daemon of a joining node drops root's rights and must still read its data
// directory.
package galera

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // the nodes are polled through it

	"github.com/txclaim/idempotent/tests/internal/ports"
)

// Provider is the Galera library the nodes load.
const Provider = "/usr/lib/galera/libgalera_smm.so"

// ErrNoGalera reports that the server, its install tool or the Galera
// provider is missing and could not be installed.
var ErrNoGalera = errors.New("galera: MariaDB with the Galera provider is not available")

// Node is one server of the cluster.
type Node struct {
	Name string
	Port int    // the SQL port on 127.0.0.1
	Dir  string // the node's directory: data/, my.cnf, error.log
	cmd  *exec.Cmd
	done chan struct{}
}

// DSN returns a go-sql-driver/mysql DSN for database db on the node.
func (n *Node) DSN(db string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", n.Port, db)
}

// Cluster is a running three-node cluster.
type Cluster struct {
	Dir    string
	Nodes  []*Node
	server string
}

// find returns the server and install tool, installing them with apt-get
// when they are missing and the process is root.
func find(ctx context.Context) (server, install string, err error) {
	look := func() error {
		var e error
		if server, e = exec.LookPath("mariadbd"); e != nil {
			return e
		}
		if install, e = exec.LookPath("mariadb-install-db"); e != nil {
			return e
		}
		if _, e = exec.LookPath("rsync"); e != nil {
			return e
		}
		_, e = os.Stat(Provider)
		return e
	}
	if err = look(); err == nil {
		return server, install, nil
	}
	if os.Geteuid() != 0 {
		return "", "", fmt.Errorf("%w: %v", ErrNoGalera, err)
	}
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "galera-4", "rsync", "mariadb-server"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, e := cmd.CombinedOutput(); e != nil {
			return "", "", fmt.Errorf("%w: apt-get %s: %v: %s", ErrNoGalera, strings.Join(args, " "), e, tail(string(out)))
		}
	}
	if err = look(); err != nil {
		return "", "", fmt.Errorf("%w after installing: %v", ErrNoGalera, err)
	}
	return server, install, nil
}

// Start makes a cluster in a new directory under parent ("" for the
// system's temporary directory) and starts its three nodes: node 1
// bootstraps, then 2 and 3 join; Start returns once every node reports
// itself Synced in a cluster of 3, polling each node's status (a joiner's
// state transfer takes tens of seconds on a loaded machine), or when ctx
// ends. On failure it stops what it started and the error carries the end
// of each node's log.
func Start(ctx context.Context, parent string) (*Cluster, error) {
	server, install, err := find(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "galera-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := ports.Free(12)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, server: server}
	var gcomm []string
	for i := range 3 {
		gcomm = append(gcomm, fmt.Sprintf("127.0.0.1:%d", ports[4*i+1]))
	}
	owner := ""
	if os.Geteuid() == 0 {
		owner = "mysql"
	}
	for i := range 3 {
		n := &Node{Name: fmt.Sprintf("n%d", i+1), Port: ports[4*i], Dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		if err := os.Mkdir(n.Dir, 0o755); err != nil {
			return nil, err
		}
		cnf := fmt.Sprintf(`[mariadbd]
datadir=%[1]s/data
socket=%[1]s/mysqld.sock
pid-file=%[1]s/mysqld.pid
log-error=%[1]s/error.log
port=%[2]d
bind-address=127.0.0.1
skip-name-resolve
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=32M
innodb_log_file_size=16M
max_connections=200
wsrep_on=ON
wsrep_provider=%[3]s
wsrep_cluster_name=idempotent-test
wsrep_node_name=%[4]s
wsrep_node_address=127.0.0.1:%[5]d
wsrep_cluster_address=gcomm://%[6]s
wsrep_provider_options="base_port=%[5]d;ist.recv_addr=127.0.0.1:%[7]d;gcache.size=16M"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:%[8]d
`, n.Dir, n.Port, Provider, n.Name, ports[4*i+1], strings.Join(gcomm, ","), ports[4*i+2], ports[4*i+3])
		if owner != "" {
			cnf += "user=" + owner + "\n"
		}
		if err := os.WriteFile(filepath.Join(n.Dir, "my.cnf"), []byte(cnf), 0o644); err != nil {
			return nil, err
		}
		args := []string{"--no-defaults", "--datadir=" + filepath.Join(n.Dir, "data"), "--auth-root-authentication-method=normal", "--skip-test-db"}
		if owner != "" {
			args = append(args, "--user="+owner)
		}
		if out, err := exec.CommandContext(ctx, install, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("galera: mariadb-install-db for %s: %w: %s", n.Name, err, tail(string(out)))
		}
		if owner != "" {
			if err := chownAll(n.Dir, owner); err != nil {
				return nil, err
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	fail := func(err error) (*Cluster, error) {
		logs := c.Logs()
		c.Stop()
		return nil, fmt.Errorf("%w\n%s", err, logs)
	}
	if err := c.Nodes[0].start(server, "--wsrep-new-cluster"); err != nil {
		return fail(err)
	}
	if err := c.Nodes[0].waitSynced(ctx, 1); err != nil {
		return fail(err)
	}
	for _, n := range c.Nodes[1:] {
		if err := n.start(server); err != nil {
			return fail(err)
		}
	}
	for _, n := range c.Nodes {
		if err := n.waitSynced(ctx, 3); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// Attach returns the running cluster whose nodes answer on ports of
// 127.0.0.1 (root, no password), started by other means: its Stop stops
// nothing, and Kill and Rejoin fail.
func Attach(ports ...int) *Cluster {
	c := &Cluster{}
	for i, p := range ports {
		c.Nodes = append(c.Nodes, &Node{Name: fmt.Sprintf("n%d", i+1), Port: p})
	}
	return c
}

// Kill stops node i at once (SIGKILL of its server), as a crash would:
// the other two keep the primary component (two of three) and go on.
func (c *Cluster) Kill(i int) error {
	n := c.Nodes[i]
	if n.cmd == nil || n.cmd.Process == nil {
		return fmt.Errorf("galera: %s is not running", n.Name)
	}
	if err := syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("galera: kill %s: %w", n.Name, err)
	}
	<-n.done
	return nil
}

// Rejoin starts node i again after Kill: it rejoins the cluster (by IST
// from a donor's gcache, or SST when the gap is too large) and Rejoin
// returns once every node is Synced in a cluster of 3 again.
func (c *Cluster) Rejoin(ctx context.Context, i int) error {
	n := c.Nodes[i]
	if c.server == "" {
		return fmt.Errorf("galera: %s was not started by Start", n.Name)
	}
	// A killed node's state is unsafe to bootstrap from, never to join.
	if err := n.start(c.server); err != nil {
		return err
	}
	for _, m := range c.Nodes {
		if err := m.waitSynced(ctx, 3); err != nil {
			return fmt.Errorf("%w\n%s", err, c.Logs())
		}
	}
	return nil
}

func chownAll(dir, owner string) error {
	u, err := user.Lookup(owner)
	if err != nil {
		return fmt.Errorf("galera: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// start runs the node's server.
func (n *Node) start(server string, extra ...string) error {
	args := append([]string{"--defaults-file=" + filepath.Join(n.Dir, "my.cnf")}, extra...)
	n.cmd = exec.Command(server, args...)
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := os.Create(filepath.Join(n.Dir, "stdout.log"))
	if err != nil {
		return err
	}
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("galera: start %s: %w", n.Name, err)
	}
	n.done = make(chan struct{})
	go func() {
		_ = n.cmd.Wait()
		_ = out.Close()
		close(n.done)
	}()
	return nil
}

// waitSynced polls the node until it is Synced in a cluster of size
// nodes, or fails when the server exits or ctx ends.
func (n *Node) waitSynced(ctx context.Context, size int) error {
	db, err := sql.Open("mysql", n.DSN("")+"?timeout=2s")
	if err != nil {
		return err
	}
	defer db.Close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		state, csize, err := status(ctx, db)
		switch {
		case err != nil:
			last = err
		case state == "Synced" && csize == size:
			return nil
		default:
			last = fmt.Errorf("state %q, cluster size %d", state, csize)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("galera: %s not Synced in a cluster of %d: %w (last: %v)", n.Name, size, ctx.Err(), last)
		case <-n.done:
			return fmt.Errorf("galera: %s exited while starting (last: %v)", n.Name, last)
		case <-tick.C:
		}
	}
}

func status(ctx context.Context, db *sql.DB) (state string, size int, err error) {
	rows, err := db.QueryContext(ctx, "SHOW STATUS WHERE Variable_name IN ('wsrep_local_state_comment', 'wsrep_cluster_size')")
	if err != nil {
		return "", 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return "", 0, err
		}
		if name == "wsrep_cluster_size" {
			size, _ = strconv.Atoi(value)
		} else {
			state = value
		}
	}
	return state, size, rows.Err()
}

// Stop stops every node (SIGTERM, then SIGKILL after 30 s) and removes
// the cluster's directory.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		if n.cmd == nil || n.cmd.Process == nil {
			continue
		}
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
	}
	for _, n := range c.Nodes {
		if n.done == nil {
			continue
		}
		select {
		case <-n.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
		}
	}
	if c.Dir != "" {
		_ = os.RemoveAll(c.Dir)
	}
}

// Logs returns the end of each node's error log.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		data, _ := os.ReadFile(filepath.Join(n.Dir, "error.log"))
		fmt.Fprintf(&b, "--- %s error.log:\n%s\n", n.Name, tail(string(data)))
	}
	return b.String()
}

func tail(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}
