// Package patroni starts throwaway Patroni clusters for the tests: a
// single-node etcd and three Patroni members, each managing a PostgreSQL
// data directory of its own, on free loopback ports (never the machine's
// shared server). Failover is Patroni's: the tests kill a leader's
// postmaster, or the whole member (Patroni and its PostgreSQL), and wait for
// Patroni to elect another leader, polling its REST API.
//
// When patroni or etcd is missing and the process runs as root, Start
// installs them from the distribution (apt-get update, then apt-get install
// patroni etcd-server), as scripts/services.sh installs the servers.
//
// As root, the members run as the postgres OS user (PostgreSQL refuses to
// run as root) and their directories belong to it.
//
// The members run with fsync=off: the tests kill processes, never the
// machine, and a killed process loses nothing the kernel already has.
package patroni

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/lib/pq" // the members are polled through it

	"github.com/txclaim/idempotent/tests/internal/ports"
)

// ErrNoPatroni reports that patroni, etcd or the PostgreSQL server binaries
// are missing and could not be installed.
var ErrNoPatroni = errors.New("patroni: patroni, etcd or PostgreSQL is not available")

// Options shape a cluster.
type Options struct {
	// Parent is the directory the cluster's directory is made in; "" is
	// the system's temporary directory. As root it must be searchable by
	// the postgres OS user.
	Parent string
	// Bin is the PostgreSQL server binaries' directory; "" is
	// /usr/lib/postgresql/15/bin.
	Bin string
	// Synchronous turns Patroni's synchronous_mode (and
	// synchronous_mode_strict) on: a commit returns once a synchronous
	// standby has flushed it, and Patroni promotes only that standby.
	Synchronous bool
}

// Member is one Patroni member: a Patroni process and the PostgreSQL
// server it manages.
type Member struct {
	Name string
	Port int    // PostgreSQL's port on 127.0.0.1
	API  int    // Patroni's REST API port on 127.0.0.1
	Dir  string // patroni.yml, data/, patroni.log

	c    *Cluster
	cmd  *exec.Cmd
	done chan struct{}
}

// Cluster is a running etcd and three Patroni members.
type Cluster struct {
	Dir     string
	Members []*Member
	Sync    bool

	patroni string
	cred    *syscall.Credential
	etcd    *exec.Cmd
	etcdEnd chan struct{}
	http    *http.Client
}

// find returns patroni's path, installing patroni and etcd-server with
// apt-get when either is missing and the process is root.
func find(ctx context.Context, bin string) (string, error) {
	look := func() (string, error) {
		p, err := exec.LookPath("patroni")
		if err != nil {
			return "", err
		}
		if _, err := exec.LookPath("etcd"); err != nil {
			return "", err
		}
		for _, b := range []string{"initdb", "postgres", "pg_ctl", "pg_basebackup", "pg_rewind"} {
			if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
				return "", err
			}
		}
		return p, nil
	}
	p, err := look()
	if err == nil {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%w: %v", ErrNoPatroni, err)
	}
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "patroni", "etcd-server", "python3-etcd", "python3-psycopg2"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, e := cmd.CombinedOutput(); e != nil {
			return "", fmt.Errorf("%w: apt-get %s: %v: %s", ErrNoPatroni, strings.Join(args, " "), e, tail(string(out), 20))
		}
	}
	if p, err = look(); err != nil {
		return "", fmt.Errorf("%w after installing: %v", ErrNoPatroni, err)
	}
	return p, nil
}

// Start makes a cluster in a new directory and starts etcd and the three
// members, then waits (Ready) until a leader runs and both other members
// stream from it — one of them as the synchronous standby with
// Options.Synchronous — or ctx ends. On failure it stops what it started
// and the error carries the end of each log.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin := opts.Bin
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	patroni, err := find(ctx, bin)
	if err != nil {
		return nil, err
	}
	c := &Cluster{patroni: patroni, Sync: opts.Synchronous, http: &http.Client{Timeout: 2 * time.Second}}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("patroni: running as root needs the postgres OS user: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if c.Dir, err = os.MkdirTemp(opts.Parent, "patroni-"); err != nil {
		return nil, err
	}
	if err := c.own(c.Dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := ports.Free(8)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) {
		logs := c.Logs()
		c.Stop()
		return nil, fmt.Errorf("%w\n%s", err, logs)
	}
	if err := c.startEtcd(ports[0], ports[1]); err != nil {
		return fail(err)
	}
	for i := range 3 {
		m := &Member{c: c, Name: fmt.Sprintf("pg%d", i+1), Port: ports[2+2*i], API: ports[3+2*i], Dir: filepath.Join(c.Dir, fmt.Sprintf("pg%d", i+1))}
		if err := c.own(m.Dir, 0o700); err != nil {
			return fail(err)
		}
		if err := os.WriteFile(filepath.Join(m.Dir, "patroni.yml"), []byte(m.config(bin, ports[0], opts.Synchronous)), 0o600); err != nil {
			return fail(err)
		}
		if c.cred != nil {
			if err := os.Chown(filepath.Join(m.Dir, "patroni.yml"), int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return fail(err)
			}
		}
		c.Members = append(c.Members, m)
	}
	// The first member bootstraps alone (initdb), then the others clone it
	// with pg_basebackup.
	if err := c.Members[0].Start(); err != nil {
		return fail(err)
	}
	if _, err := c.WaitLeader(ctx, ""); err != nil {
		return fail(err)
	}
	for _, m := range c.Members[1:] {
		if err := m.Start(); err != nil {
			return fail(err)
		}
	}
	if _, err := c.Ready(ctx); err != nil {
		return fail(err)
	}
	return c, nil
}

// own makes dir with perm, owned by the members' OS user.
func (c *Cluster) own(dir string, perm os.FileMode) error {
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	if err := os.Chmod(dir, perm); err != nil {
		return err
	}
	if c.cred == nil {
		return nil
	}
	return os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid))
}

func (c *Cluster) startEtcd(client, peer int) error {
	dir := filepath.Join(c.Dir, "etcd")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	cu, pu := fmt.Sprintf("http://127.0.0.1:%d", client), fmt.Sprintf("http://127.0.0.1:%d", peer)
	c.etcd = exec.Command("etcd", "--name", "etcd1", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", cu, "--advertise-client-urls", cu,
		"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
		"--initial-cluster", "etcd1="+pu, "--initial-cluster-state", "new",
		"--enable-v2=true", "--log-level", "warn")
	c.etcd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return err
	}
	c.etcd.Stdout, c.etcd.Stderr = out, out
	if err := c.etcd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("patroni: start etcd: %w", err)
	}
	c.etcdEnd = make(chan struct{})
	go func() { _ = c.etcd.Wait(); _ = out.Close(); close(c.etcdEnd) }()
	return nil
}

// config is the member's patroni.yml. The timings make a failover take
// seconds rather than Patroni's default half minute, with room for a
// loaded machine: the leader key lives 20 s (ttl), each member runs its
// loop every 2 s and gives the DCS 5 s. primary_start_timeout 0 makes a
// crashed primary fail over to a standby at once instead of being
// restarted in place.
func (m *Member) config(bin string, etcdPort int, sync bool) string {
	return fmt.Sprintf(`scope: idempotent-test
namespace: /idempotent/
name: %[1]s
log:
  level: INFO
  dir: %[2]s
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd3:
  hosts: 127.0.0.1:%[4]d
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 2
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    primary_start_timeout: 0
    synchronous_mode: %[5]t
    synchronous_mode_strict: %[5]t
    postgresql:
      use_pg_rewind: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      parameters:
        wal_log_hints: "on"
        max_connections: 100
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        shared_buffers: 32MB
        fsync: "off"
        full_page_writes: "on"
        wal_receiver_status_interval: 1s
        wal_retrieve_retry_interval: 200ms
        log_min_messages: warning
        log_min_error_statement: panic
  initdb:
  - encoding: UTF8
  - locale: C
  - auth: trust
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[6]d
  connect_address: 127.0.0.1:%[6]d
  data_dir: %[2]s/data
  bin_dir: %[7]s
  pgpass: %[2]s/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: %[2]s
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
`, m.Name, m.Dir, m.API, etcdPort, sync, m.Port, bin)
}

// Start starts the member's Patroni, which starts (or clones, or rewinds)
// its PostgreSQL. Patroni runs in a process group of its own; PostgreSQL
// runs in another, which Patroni makes for it.
func (m *Member) Start() error {
	cmd := exec.Command(m.c.patroni, filepath.Join(m.Dir, "patroni.yml"))
	cmd.Dir = m.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "HOME="+m.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.c.cred, Setpgid: true}
	out, err := os.OpenFile(filepath.Join(m.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("patroni: start %s: %w", m.Name, err)
	}
	done := make(chan struct{})
	m.cmd, m.done = cmd, done
	go func() { _ = cmd.Wait(); _ = out.Close(); close(done) }()
	return nil
}

// Running reports whether the member's Patroni process is running.
func (m *Member) Running() bool {
	if m.done == nil {
		return false
	}
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// DSN returns a key=value connection string (lib/pq and pgx both read it)
// for the member's server alone, over TCP, with the given application_name.
func (m *Member) DSN(app string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5 application_name=%s", m.Port, app)
}

// DSN returns the multi-host connection string a client uses to find the
// leader by itself: every member's address and
// target_session_attrs=read-write, which lib/pq (v1.12 or later) and pgx
// both read. connect_timeout is short: a member that does not answer holds
// every new connection that long.
func (c *Cluster) DSN(app string) string {
	hosts, ports := make([]string, len(c.Members)), make([]string, len(c.Members))
	for i, m := range c.Members {
		hosts[i], ports[i] = "127.0.0.1", strconv.Itoa(m.Port)
	}
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable connect_timeout=2 target_session_attrs=read-write application_name=%s",
		strings.Join(hosts, ","), strings.Join(ports, ","), app)
}

// Postmaster returns the pid of the member's postmaster, from its
// postmaster.pid.
func (m *Member) Postmaster() (int, error) {
	data, err := os.ReadFile(filepath.Join(m.Dir, "data", "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("patroni: %s has no postmaster: %w", m.Name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("patroni: %s: bad postmaster.pid %q", m.Name, tail(string(data), 1))
	}
	return pid, nil
}

// KillPostmaster sends SIGKILL to the member's postmaster alone and waits
// until it is gone: its backends notice and exit, Patroni sees PostgreSQL
// down and, for a leader (primary_start_timeout 0), gives up the leader
// key so that a standby is promoted.
func (m *Member) KillPostmaster(ctx context.Context) error {
	pid, err := m.Postmaster()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("patroni: kill %s's postmaster %d: %w", m.Name, pid, err)
	}
	return waitGone(ctx, pid)
}

// Kill sends SIGKILL to the member's Patroni and to its PostgreSQL's whole
// process group at once, as when the node dies: the leader key then
// expires after the ttl and another member takes it. Restart brings the
// member back.
func (m *Member) Kill(ctx context.Context) error {
	pid, perr := m.Postmaster()
	if m.cmd != nil {
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	}
	if perr == nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL) // the postmaster leads its group
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if m.done != nil {
		select {
		case <-m.done:
		case <-ctx.Done():
			return fmt.Errorf("patroni: %s survived SIGKILL: %w", m.Name, ctx.Err())
		}
	}
	if perr == nil {
		return waitGone(ctx, pid)
	}
	return nil
}

// waitGone polls until no process has pid.
func waitGone(ctx context.Context, pid int) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			// A zombie is gone for every purpose but its parent's wait.
			if f := strings.Fields(string(raw)); len(f) > 2 && f[2] == "Z" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("patroni: process %d survived SIGKILL: %w", pid, ctx.Err())
		case <-tick.C:
		}
	}
}

// Status is one member as Patroni's GET /cluster reports it.
type Status struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, replica, sync_standby
	State    string `json:"state"` // running, streaming, stopped, starting, …
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"`
}

// Statuses asks each running member's REST API for the cluster's view
// (GET /cluster) and returns the first answer.
func (c *Cluster) Statuses(ctx context.Context) ([]Status, error) {
	var last error = errors.New("no member running")
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		var body struct {
			Members []Status `json:"members"`
		}
		if _, err := m.get(ctx, "/cluster", &body); err != nil {
			last = err
			continue
		}
		return body.Members, nil
	}
	return nil, last
}

// get GETs path from the member's REST API, decoding JSON into v when not
// nil, and returns the status code.
func (m *Member) get(ctx context.Context, path string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", m.API, path), nil)
	if err != nil {
		return 0, err
	}
	resp, err := m.c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, v); err != nil {
			return resp.StatusCode, fmt.Errorf("patroni: %s %s: %w", m.Name, path, err)
		}
	}
	return resp.StatusCode, nil
}

// IsPrimary asks the member's REST API whether it is the running leader
// (GET /primary answers 200 only then: the health check a proxy such as
// HAProxy routes writes by).
func (m *Member) IsPrimary(ctx context.Context) bool {
	code, err := m.get(ctx, "/primary", nil)
	return err == nil && code == http.StatusOK
}

// member returns the member named name.
func (c *Cluster) member(name string) *Member {
	for _, m := range c.Members {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// poll calls check every 200 ms until it reports done, or fails with its
// last reason when ctx ends or after 5 minutes.
func poll(ctx context.Context, what string, check func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := check()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("patroni: waiting for %s: %w (last: %v)", what, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// WaitLeader polls the REST API until a member other than not ("" for
// any) is the running leader and answers GET /primary with 200, and
// returns it.
func (c *Cluster) WaitLeader(ctx context.Context, not string) (*Member, error) {
	var leader *Member
	err := poll(ctx, "a leader other than "+strconv.Quote(not), func() (bool, error) {
		sts, err := c.Statuses(ctx)
		if err != nil {
			return false, err
		}
		for _, s := range sts {
			if s.Role != "leader" || s.Name == not {
				continue
			}
			m := c.member(s.Name)
			if m == nil || s.State != "running" || !m.IsPrimary(ctx) {
				return false, fmt.Errorf("leader %s is %s", s.Name, s.State)
			}
			leader = m
			return true, nil
		}
		return false, fmt.Errorf("no leader among %+v", sts)
	})
	return leader, err
}

// Ready polls until a leader runs and every member whose Patroni is
// running streams from it (Patroni's view, confirmed in the leader's
// pg_stat_replication), one of them as the synchronous standby when the
// cluster is synchronous. It returns the leader.
func (c *Cluster) Ready(ctx context.Context) (*Member, error) {
	leader, err := c.WaitLeader(ctx, "")
	if err != nil {
		return nil, err
	}
	want := 0
	for _, m := range c.Members {
		if m != leader && m.Running() {
			want++
		}
	}
	db, err := sql.Open("postgres", leader.DSN("patroni-ready"))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	err = poll(ctx, fmt.Sprintf("%d standbys streaming from %s", want, leader.Name), func() (bool, error) {
		var streaming, sync int
		err := db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE state = 'streaming'),
			count(*) FILTER (WHERE state = 'streaming' AND sync_state = 'sync') FROM pg_stat_replication`).Scan(&streaming, &sync)
		if err != nil {
			return false, err
		}
		if streaming < want || (c.Sync && sync < 1) {
			return false, fmt.Errorf("%d streaming, %d synchronous", streaming, sync)
		}
		sts, err := c.Statuses(ctx)
		if err != nil {
			return false, err
		}
		up, syncStandby := 0, 0
		for _, s := range sts {
			if m := c.member(s.Name); m != nil && m != leader && (s.State == "running" || s.State == "streaming") {
				up++
				if s.Role == "sync_standby" {
					syncStandby++
				}
			}
		}
		if up < want || (c.Sync && syncStandby < 1) {
			return false, fmt.Errorf("Patroni reports %+v", sts)
		}
		return true, nil
	})
	return leader, err
}

// Switchover asks the leader's REST API (POST /switchover) to hand the
// leadership to candidate, as an operator's planned switchover does: the
// leader is demoted and restarted as a standby, candidate promoted. With
// synchronous mode, candidate must be the synchronous standby. It returns
// once candidate is the running leader.
func (c *Cluster) Switchover(ctx context.Context, leader, candidate *Member) error {
	body := strings.NewReader(fmt.Sprintf(`{"leader": %q, "candidate": %q}`, leader.Name, candidate.Name))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/switchover", leader.API), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	cl := &http.Client{Timeout: 2 * time.Minute}
	resp, err := cl.Do(req)
	if err != nil {
		return fmt.Errorf("patroni: switchover to %s: %w", candidate.Name, err)
	}
	msg, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("patroni: switchover to %s: %s: %s", candidate.Name, resp.Status, msg)
	}
	return poll(ctx, candidate.Name+" to lead", func() (bool, error) {
		m, err := c.WaitLeader(ctx, leader.Name)
		if err != nil {
			return false, err
		}
		return m == candidate, fmt.Errorf("%s leads", m.Name)
	})
}

// Leader returns the member the REST API reports as the running leader.
func (c *Cluster) Leader(ctx context.Context) (*Member, error) { return c.WaitLeader(ctx, "") }

// Stop stops every member (SIGTERM to Patroni, which stops its
// PostgreSQL; SIGKILL to both after 60 s) and etcd, and removes the
// cluster's directory.
func (c *Cluster) Stop() {
	for _, m := range c.Members {
		if m.Running() {
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	for _, m := range c.Members {
		if m.done == nil {
			continue
		}
		select {
		case <-m.done:
		case <-time.After(60 * time.Second):
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			<-m.done
		}
		// A postmaster whose Patroni was killed outlives it.
		if pid, err := m.Postmaster(); err == nil {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if c.etcd != nil && c.etcd.Process != nil {
		_ = syscall.Kill(-c.etcd.Process.Pid, syscall.SIGKILL)
		<-c.etcdEnd
	}
	if c.Dir != "" {
		_ = os.RemoveAll(c.Dir)
	}
}

// Logs returns the end of each member's Patroni and PostgreSQL logs and of
// etcd's.
func (c *Cluster) Logs() string {
	var b strings.Builder
	show := func(name, path string) {
		data, _ := os.ReadFile(path)
		fmt.Fprintf(&b, "--- %s:\n%s\n", name, tail(string(data), 25))
	}
	show("etcd", filepath.Join(c.Dir, "etcd", "etcd.log"))
	for _, m := range c.Members {
		show(m.Name+" patroni", filepath.Join(m.Dir, "patroni.log"))
		show(m.Name+" stdout", filepath.Join(m.Dir, "stdout.log"))
		logs, _ := filepath.Glob(filepath.Join(m.Dir, "data", "log", "*"))
		for _, l := range logs {
			show(m.Name+" "+filepath.Base(l), l)
		}
	}
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
