package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// ErrAcksOutrunReplication is wrapped by [ReplicationReport.Err] when a
// commit can return to the consumer — which then acks the message — before
// any standby has it. If the primary dies then and a standby is promoted,
// the acked message's claim and effect are both gone, and the broker will
// not deliver it again.
var ErrAcksOutrunReplication = errors.New("postgres: a commit can be acknowledged before a standby has it")

// Standby is one row of pg_stat_replication as the primary reports it.
type Standby struct {
	// Name is the standby's application_name, as synchronous_standby_names
	// lists it.
	Name string
	// State is the walsender's state: "streaming", "catchup", "startup",
	// "backup" or "stopping".
	State string
	// SyncState is "sync" or "quorum" for a standby commits wait for,
	// "potential" or "async" for one they do not.
	SyncState string
}

// ReplicationReport says whether a commit on this connection can be
// acknowledged before a standby has it. CheckReplication fills it in.
type ReplicationReport struct {
	// InRecovery is true when the connection is to a standby: it cannot
	// take claims at all.
	InRecovery bool
	// SynchronousCommit is the session's synchronous_commit: "on",
	// "remote_apply", "remote_write", "local" or "off".
	SynchronousCommit string
	// SynchronousStandbyNames is the server's synchronous_standby_names;
	// "" means no commit waits for a standby.
	SynchronousStandbyNames string
	// Standbys are the standbys streaming from this server, from
	// pg_stat_replication.
	Standbys []Standby
	// StandbysHidden is true when pg_stat_replication hid its details
	// (state, sync_state) from the connection's role: grant it
	// pg_monitor (or pg_read_all_stats) for a complete report.
	StandbysHidden bool
}

// waitsForStandby reports whether synchronous_commit makes a commit wait for
// the standbys in synchronous_standby_names.
func (r ReplicationReport) waitsForStandby() bool {
	switch r.SynchronousCommit {
	case "on", "remote_apply", "remote_write":
		return strings.TrimSpace(r.SynchronousStandbyNames) != ""
	}
	return false
}

// Synchronous reports whether every commit waits until a standby has it
// (synchronous_standby_names is set and synchronous_commit is on,
// remote_write or remote_apply) and at least one standby commits wait for
// is connected. Then a failover to that standby keeps every acknowledged
// commit.
func (r ReplicationReport) Synchronous() bool {
	if r.InRecovery || !r.waitsForStandby() {
		return false
	}
	for _, s := range r.Standbys {
		if s.SyncState == "sync" || s.SyncState == "quorum" {
			return true
		}
	}
	return false
}

// Warnings returns one sentence per way in which this configuration can
// lose or stall an acknowledged message, or nil when there is none.
func (r ReplicationReport) Warnings() []string {
	var w []string
	if r.InRecovery {
		w = append(w, "the connection is to a standby (pg_is_in_recovery() is true): claims need the primary; use target_session_attrs=read-write in the connection string")
		return w
	}
	switch r.SynchronousCommit {
	case "off":
		w = append(w, "synchronous_commit is off: a commit is acknowledged before it is flushed even locally, so a crash of the primary alone can lose acked messages")
	case "local":
		if len(r.Standbys) > 0 || r.SynchronousStandbyNames != "" {
			w = append(w, "synchronous_commit is local: commits do not wait for any standby, so a failover can lose acked messages")
		}
	}
	waits := r.waitsForStandby()
	if !waits && r.SynchronousCommit != "local" && r.SynchronousCommit != "off" && len(r.Standbys) > 0 {
		names := make([]string, len(r.Standbys))
		for i, s := range r.Standbys {
			names[i] = s.Name
		}
		w = append(w, fmt.Sprintf("replication is asynchronous (synchronous_standby_names is empty) to %s: a commit is acknowledged before the standby has it, so promoting it after the primary dies loses the messages acked in between", strings.Join(names, ", ")))
	}
	if waits && !r.StandbysHidden && !r.Synchronous() {
		w = append(w, fmt.Sprintf("synchronous_standby_names is %q but no such standby is connected: commits wait (and consumers stall) until one is", r.SynchronousStandbyNames))
	}
	if waits && r.SynchronousCommit == "remote_write" {
		w = append(w, "synchronous_commit is remote_write: a standby acknowledges before flushing, so losing the primary and the standby's operating system together can lose acked messages")
	}
	if r.StandbysHidden {
		w = append(w, "pg_stat_replication hides the standbys' state from this role: grant it pg_monitor for a complete report")
	}
	return w
}

// Err returns nil when acknowledged commits survive a failover to a
// connected synchronous standby, and otherwise an error wrapping
// [ErrAcksOutrunReplication] that names the settings. A server with no
// standby and no synchronous_standby_names is reported as asynchronous too:
// if it has a standby that this connection cannot see (a managed service's
// replica, a standby behind a pooler), nothing holds acks back for it.
func (r ReplicationReport) Err() error {
	if r.Synchronous() {
		return nil
	}
	msg := fmt.Sprintf("synchronous_commit = %s, synchronous_standby_names = %q, %d standby(s) connected", r.SynchronousCommit, r.SynchronousStandbyNames, len(r.Standbys))
	if r.InRecovery {
		msg = "the connection is to a standby"
	}
	return fmt.Errorf("%w (%s)", ErrAcksOutrunReplication, msg)
}

// replicationSQL reads what CheckReplication reports in one round trip.
const replicationSQL = `SELECT pg_is_in_recovery(), current_setting('synchronous_commit'), current_setting('synchronous_standby_names')`

// standbysSQL lists the standbys streaming from the server.
const standbysSQL = `SELECT coalesce(application_name, ''), state, sync_state FROM pg_stat_replication ORDER BY application_name`

// CheckReplication reports whether a commit on db can be acknowledged
// before a standby has it: the session's synchronous_commit, the server's
// synchronous_standby_names and the standbys in pg_stat_replication. Call
// it at start-up on the pool the consumers use (role and database defaults
// of synchronous_commit apply to it), and log the report's Warnings or
// refuse to start on its Err — see docs/deployment.md. It runs two
// read-only statements and changes nothing.
func CheckReplication(ctx context.Context, db *sql.DB) (ReplicationReport, error) {
	var r ReplicationReport
	if db == nil {
		return r, errors.New("postgres: CheckReplication: nil *sql.DB")
	}
	if err := db.QueryRowContext(ctx, replicationSQL).Scan(&r.InRecovery, &r.SynchronousCommit, &r.SynchronousStandbyNames); err != nil {
		return r, fmt.Errorf("postgres: CheckReplication: %w", err)
	}
	rows, err := db.QueryContext(ctx, standbysSQL)
	if err != nil {
		return r, fmt.Errorf("postgres: CheckReplication: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s Standby
		var state, sync sql.NullString
		if err := rows.Scan(&s.Name, &state, &sync); err != nil {
			return r, fmt.Errorf("postgres: CheckReplication: %w", err)
		}
		if !state.Valid || !sync.Valid {
			r.StandbysHidden = true
		}
		s.State, s.SyncState = state.String, sync.String
		r.Standbys = append(r.Standbys, s)
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("postgres: CheckReplication: %w", err)
	}
	return r, nil
}
