package postgres

import (
	"errors"
	"strings"
	"testing"
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
