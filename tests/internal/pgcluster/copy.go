package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// The copies of a cluster that a restore puts back, or a clone starts
// from. Each is a Cluster of its own (a directory, a port), not started.
// Set Port to the original's before Start to put it in the original's
// place, as a restore does.

// NewBackup makes a cluster from a base backup of the running primary
// (pg_basebackup -X stream, with neither standby.signal nor
// recovery.signal). Started as it is, it runs crash recovery from the
// backup's label and WAL and comes up as a server of its own, with the
// primary's system identifier, timeline and OIDs: a backup restored and
// started, or a staging server cloned from production.
func NewBackup(ctx context.Context, primary *Cluster, opts Options) (*Cluster, error) {
	c, err := create(primary.Bin, opts)
	if err != nil {
		return nil, err
	}
	bb := c.command(ctx, "pg_basebackup", "-D", c.DataDir(), "-h", primary.Dir, "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-X", "stream", "-c", "fast", "--no-sync")
	if out, err := bb.CombinedOutput(); err != nil {
		c.Remove()
		return nil, fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	return c, nil
}

// NewCopy makes a cluster from a copy of the data directory of c, which
// must not be running: after Kill, the copy is what an atomic volume
// snapshot of the running server holds, and started it runs crash
// recovery; after Stop, it is a cold backup.
func NewCopy(ctx context.Context, c *Cluster, opts Options) (*Cluster, error) {
	if c.cmd != nil {
		return nil, fmt.Errorf("copy of %s: the server is running", c.Dir)
	}
	cp, err := create(c.Bin, opts)
	if err != nil {
		return nil, err
	}
	// cp -a keeps the files' owner (the postgres OS user, as root) and modes.
	if out, err := exec.CommandContext(ctx, "cp", "-a", c.DataDir(), cp.DataDir()).CombinedOutput(); err != nil {
		cp.Remove()
		return nil, fmt.Errorf("copy the data directory: %w\n%s", err, out)
	}
	return cp, nil
}

// Configure appends settings ("name = value" lines) to the cluster's
// postgresql.auto.conf, read at its next start.
func (c *Cluster) Configure(settings ...string) error {
	f, err := os.OpenFile(filepath.Join(c.DataDir(), "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	for _, s := range settings {
		if _, err := fmt.Fprintln(f, s); err != nil {
			_ = f.Close()
			return err
		}
	}
	return f.Close()
}

// Touch creates an empty file in the data directory, owned by the
// server's OS user: recovery.signal, say.
func (c *Cluster) Touch(name string) error {
	return c.own(os.WriteFile(filepath.Join(c.DataDir(), name), nil, 0o600), filepath.Join(c.DataDir(), name))
}

// Mkdir creates a directory in the cluster's directory, writable by the
// server's OS user (a WAL archive, say), and returns its path.
func (c *Cluster) Mkdir(name string) (string, error) {
	dir := filepath.Join(c.Dir, name)
	return dir, c.own(os.Mkdir(dir, 0o700), dir)
}

// own gives path to the server's OS user, after err (a creation) if nil.
func (c *Cluster) own(err error, path string) error {
	if err != nil || c.cred == nil {
		return err
	}
	return os.Chown(path, int(c.cred.Uid), int(c.cred.Gid))
}

// Run runs one of the server's client binaries (pg_dump, pg_restore) as
// the cluster's OS user, failing with its output.
func (c *Cluster) Run(ctx context.Context, name string, args ...string) error {
	if out, err := c.command(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, out)
	}
	return nil
}
