package tests

import (
	"database/sql"
	"net/url"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// TestClassifyNoWritableHost makes each driver refuse every host of a
// connection string with target_session_attrs=read-write, as between a
// primary's death and a standby's promotion, and checks that the Postgres
// dialect classifies the refusal as a lost connection (retried) rather
// than as the handler's failure. The shared server's session is made
// read-only by default (options=-c default_transaction_read_only=on), which
// both drivers' read-write check refuses; the standby's own refusals are
// proven on a Patroni cluster (TestPatroniStandbyIsRetried).
func TestClassifyNoWritableHost(t *testing.T) {
	t.Parallel()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	u, err := url.Parse(pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	q.Set("options", "-c default_transaction_read_only=on")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads "+" literally
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := sql.OpenDB(connector(t, drv, u.String()))
			defer db.Close()
			err := db.Ping()
			if err == nil {
				t.Fatal("a read-only session passed target_session_attrs=read-write")
			}
			if got := postgres.New().Classify(err); got.Kind != dialect.KindConnection {
				t.Fatalf("Classify(%v) = %+v, want KindConnection", err, got)
			}
		})
	}
}
