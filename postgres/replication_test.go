package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
)

func TestReplicationReport(t *testing.T) {
	syncStandby := []Standby{{Name: "standby", State: "streaming", SyncState: "sync"}}
	asyncStandby := []Standby{{Name: "standby", State: "streaming", SyncState: "async"}}
	for _, tc := range []struct {
		name     string
		r        ReplicationReport
		sync     bool
		warnings []string // a word each warning must contain, in order
	}{
		{"synchronous", ReplicationReport{SynchronousCommit: "on", SynchronousStandbyNames: "standby", Standbys: syncStandby}, true, nil},
		{"remote_apply", ReplicationReport{SynchronousCommit: "remote_apply", SynchronousStandbyNames: "ANY 1 (a, b)", Standbys: []Standby{{Name: "a", SyncState: "quorum", State: "streaming"}}}, true, nil},
		{"remote_write", ReplicationReport{SynchronousCommit: "remote_write", SynchronousStandbyNames: "standby", Standbys: syncStandby}, true, []string{"remote_write"}},
		{"asynchronous", ReplicationReport{SynchronousCommit: "on", Standbys: asyncStandby}, false, []string{"asynchronous"}},
		{"local", ReplicationReport{SynchronousCommit: "local", SynchronousStandbyNames: "standby", Standbys: syncStandby}, false, []string{"local"}},
		{"off", ReplicationReport{SynchronousCommit: "off"}, false, []string{"off"}},
		{"standby missing", ReplicationReport{SynchronousCommit: "on", SynchronousStandbyNames: "standby"}, false, []string{"no such standby"}},
		{"standalone", ReplicationReport{SynchronousCommit: "on"}, false, nil},
		{"hidden", ReplicationReport{SynchronousCommit: "on", Standbys: []Standby{{Name: "standby"}}, StandbysHidden: true}, false, []string{"asynchronous", "pg_monitor"}},
		{"in recovery", ReplicationReport{InRecovery: true, SynchronousCommit: "on", SynchronousStandbyNames: "standby", Standbys: syncStandby}, false, []string{"read-write"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.Synchronous(); got != tc.sync {
				t.Errorf("Synchronous() = %v, want %v", got, tc.sync)
			}
			err := tc.r.Err()
			if tc.sync != (err == nil) {
				t.Errorf("Err() = %v with Synchronous() %v", err, tc.sync)
			}
			if err != nil && !errors.Is(err, ErrAcksOutrunReplication) {
				t.Errorf("Err() = %v, does not wrap ErrAcksOutrunReplication", err)
			}
			w := tc.r.Warnings()
			if len(w) != len(tc.warnings) {
				t.Fatalf("Warnings() = %q, want %d", w, len(tc.warnings))
			}
			for i, word := range tc.warnings {
				if !strings.Contains(w[i], word) {
					t.Errorf("warning %d = %q, want it to mention %q", i, w[i], word)
				}
			}
		})
	}
}

// sqlStateError is a server error with an SQLSTATE, as both drivers' errors
// expose it.
type sqlStateError string

func (e sqlStateError) Error() string {
	return "ERROR: prepared statement (SQLSTATE " + string(e) + ")"
}
func (e sqlStateError) SQLState() string { return string(e) }

func TestCheckServerNamesThePooler(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		q := func(context.Context, string, ...any) (string, error) { return "", sqlStateError(code) }
		err := New().CheckServer(context.Background(), dialect.Table{Name: "t"}, q)
		if !errors.Is(err, ErrPooledPreparedStatement) || errors.Is(err, dialect.ErrWrongDatabase) {
			t.Errorf("%s: CheckServer = %v, want ErrPooledPreparedStatement and not ErrWrongDatabase", code, err)
		}
		if err == nil || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
			t.Errorf("%s: %v does not say what to set", code, err)
		}
	}
	q := func(context.Context, string, ...any) (string, error) { return "", sqlStateError("42883") }
	if err := New().CheckServer(context.Background(), dialect.Table{Name: "t"}, q); !errors.Is(err, dialect.ErrWrongDatabase) {
		t.Errorf("42883: CheckServer = %v, want ErrWrongDatabase", err)
	}
}
