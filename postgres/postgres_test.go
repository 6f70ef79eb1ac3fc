package postgres_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
	"github.com/txclaim/idempotent/postgres"
)

// tables are the names every table-taking method is golden-tested with.
// Billing.Mixed_Case and the last one cannot come out of dialect.ParseTable
// (it refuses upper-case letters and quotes); they show the dialect quotes
// whatever it is given.
var tables = []dialect.Table{
	{Name: "processed_messages"},
	{Schema: "app", Name: "processed_messages"},
	{Name: "select"},
	{Schema: "Billing", Name: "Mixed_Case"},
	{Name: "t" + strings.Repeat("x", 49)},
	{Name: "t" + strings.Repeat("x", 50)},
	{Schema: "s", Name: strings.Repeat("a", 60) + "bcd"},
	{Schema: "s", Name: strings.Repeat("a", 60) + "bce"},
	{Name: `we"ird; DROP TABLE y`},
}

func TestSchemaSQLGolden(t *testing.T) {
	d := postgres.New()
	var b strings.Builder
	for _, tb := range tables {
		fmt.Fprintf(&b, "-- table %q.%q\n", tb.Schema, tb.Name)
		for _, s := range d.SchemaSQL(tb) {
			fmt.Fprintf(&b, "%s;\n", s)
		}
		b.WriteString("\n")
	}
	golden.Compare(t, filepath.Join("testdata", "schema_sql.golden"), b.String())
}

// TestSchemaObjectsGolden covers the dialect.SchemaInspector side of the
// schema: the objects of each mode, the catalog query that finds each, and
// the lock timeout of the DDL.
func TestSchemaObjectsGolden(t *testing.T) {
	d := postgres.New()
	var b strings.Builder
	for _, tb := range tables[:2] {
		for _, partitioned := range []bool{false, true} {
			fmt.Fprintf(&b, "-- table %q.%q partitioned=%v\n", tb.Schema, tb.Name, partitioned)
			for _, o := range d.SchemaObjects(tb, partitioned) {
				q, args := d.ObjectExistsSQL(o)
				fmt.Fprintf(&b, "-- %v\n%s; -- %q\n%s;\n", o, q, args, o.CreateSQL)
			}
			b.WriteString("\n")
		}
	}
	stmt, session := d.DDLLockTimeoutSQL(5 * time.Second)
	fmt.Fprintf(&b, "-- DDLLockTimeoutSQL(5s), session=%v\n%s;\n", session, stmt)
	golden.Compare(t, filepath.Join("testdata", "schema_objects.golden"), b.String())
}

// SchemaSQL is SchemaLockSQL and the objects' CreateSQL, in order, in both
// modes: a migration and EnsureSchema create the same objects.
func TestSchemaSQLIsTheObjects(t *testing.T) {
	d := postgres.New()
	for _, tb := range tables {
		for _, partitioned := range []bool{false, true} {
			all := d.SchemaSQL(tb)
			if partitioned {
				all = d.PartitionedSchemaSQL(tb)
			}
			want := []string{d.SchemaLockSQL(tb)}
			for _, o := range d.SchemaObjects(tb, partitioned) {
				want = append(want, o.CreateSQL)
			}
			if !slices.Equal(all, want) {
				t.Errorf("%v partitioned=%v: schema SQL\n%q\nis not the lock and the objects\n%q", tb, partitioned, all, want)
			}
		}
	}
}

func TestIsDDLLockTimeout(t *testing.T) {
	d := postgres.New()
	if !d.IsDDLLockTimeout(fmt.Errorf("wrapped: %w", &pq.Error{Code: "55P03"})) || !d.IsDDLLockTimeout(sqlStateErr("55P03")) {
		t.Error("55P03 is not a DDL lock timeout")
	}
	for _, err := range []error{nil, &pq.Error{Code: "57014"}, &pq.Error{Code: "40P01"}, errors.New("lock timeout")} {
		if d.IsDDLLockTimeout(err) {
			t.Errorf("IsDDLLockTimeout(%v) = true", err)
		}
	}
}

func TestClaimSQLGolden(t *testing.T) {
	d := postgres.New()
	var b strings.Builder
	for _, tb := range tables {
		fmt.Fprintf(&b, "-- table %q.%q\n%s;\n\n", tb.Schema, tb.Name, d.ClaimSQL(tb))
	}
	golden.Compare(t, filepath.Join("testdata", "claim_sql.golden"), b.String())
}

func TestFoldClaimSQLGolden(t *testing.T) {
	d := postgres.New()
	const companion = `UPDATE "s"."counters" SET n = n + 1 WHERE id = $3`
	var b strings.Builder
	for _, tb := range tables {
		fmt.Fprintf(&b, "-- table %q.%q\n%s;\n%s;\n\n", tb.Schema, tb.Name,
			d.FoldClaimSQL(d.ClaimSQL(tb), companion), d.FoldClaimSQL(d.ClaimAtSQL(tb), strings.ReplaceAll(companion, "$3", "$4")))
	}
	golden.Compare(t, filepath.Join("testdata", "fold_claim_sql.golden"), b.String())
	if q := d.FoldClaimSQL("", companion); q != "" {
		t.Errorf("FoldClaimSQL with no claim = %q, want \"\"", q)
	}
	if q := d.FoldClaimSQL(d.ClaimSQL(tables[0]), ""); q != "" {
		t.Errorf("FoldClaimSQL with no companion = %q, want \"\"", q)
	}
}

func TestLockTimeoutSQLGolden(t *testing.T) {
	d := postgres.New()
	var b strings.Builder
	for _, dur := range []time.Duration{-time.Second, 0, 1, time.Millisecond, 1500 * time.Microsecond, 50 * time.Millisecond, 5 * time.Second, time.Hour, 24 * 24 * time.Hour, 25 * 24 * time.Hour, 1 << 62} {
		fmt.Fprintf(&b, "-- %v\n%q\n\n", dur, d.LockTimeoutSQL(dur))
	}
	golden.Compare(t, filepath.Join("testdata", "lock_timeout_sql.golden"), b.String())
}

func TestTxIDSQLGolden(t *testing.T) {
	golden.Compare(t, filepath.Join("testdata", "txid_sql.golden"), postgres.New().TxIDSQL()+";\n")
}

func TestNameAndLimits(t *testing.T) {
	d := postgres.New()
	if d.Name() != "postgres" {
		t.Errorf("Name() = %q", d.Name())
	}
	if d.MaxKeyBytes() != postgres.MaxKeyBytes || postgres.MaxKeyBytes != 1024 {
		t.Errorf("MaxKeyBytes() = %d, constant %d", d.MaxKeyBytes(), postgres.MaxKeyBytes)
	}
	var _ dialect.Dialect = d
}

// Every processed_at index name fits in 63 bytes and is distinct for
// distinct tables; each schema's advisory lock is distinct too.
func TestSchemaSQLNamesAreDistinct(t *testing.T) {
	d := postgres.New()
	seen := map[string]dialect.Table{}
	for _, tb := range tables {
		stmts := d.SchemaSQL(tb)
		if len(stmts) != 4 {
			t.Fatalf("%v: %d statements", tb, len(stmts))
		}
		for _, s := range stmts {
			if _, dup := seen[s]; dup {
				t.Errorf("statement %q for %v and %v", s, tb, seen[s])
			}
			seen[s] = tb
		}
		idx := stmts[2]
		name := idx[len("CREATE INDEX IF NOT EXISTS "):strings.Index(idx, " ON ")]
		if unq := strings.ReplaceAll(strings.Trim(name, `"`), `""`, `"`); len(unq) > dialect.MaxIdentifierBytes {
			t.Errorf("index name %s is %d bytes; Postgres would truncate it", name, len(unq))
		}
	}
}

// sqlStateErr is a driver error of some other driver: only the method.
type sqlStateErr string

func (e sqlStateErr) Error() string    { return "sqlstate " + string(e) }
func (e sqlStateErr) SQLState() string { return string(e) }

// msgStateErr is another driver's server error with its message.
type msgStateErr struct{ code, msg string }

func (e msgStateErr) Error() string    { return e.msg }
func (e msgStateErr) SQLState() string { return e.code }

// safeToRetryErr mimics pgx's (pgconn) client-side connection failures.
type safeToRetryErr struct{ safe bool }

func (e safeToRetryErr) Error() string     { return "conn closed" }
func (e safeToRetryErr) SafeToRetry() bool { return e.safe }

func TestClassify(t *testing.T) {
	d := postgres.New()
	ser := func(code string) dialect.Class { return dialect.Class{Kind: dialect.KindSerialization, Code: code} }
	conn := func(code string) dialect.Class { return dialect.Class{Kind: dialect.KindConnection, Code: code} }
	other := func(code string) dialect.Class { return dialect.Class{Kind: dialect.KindOther, Code: code} }
	cases := []struct {
		name string
		err  error
		want dialect.Class
	}{
		{"nil", nil, dialect.Class{}},
		{"pq 40001", &pq.Error{Code: "40001"}, ser("40001")},
		{"pq 40P01", &pq.Error{Code: "40P01"}, ser("40P01")},
		{"pgx-style 40001", sqlStateErr("40001"), ser("40001")},
		{"pgx-style 40P01", sqlStateErr("40P01"), ser("40P01")},
		{"other driver 40001", sqlStateErr("40001"), ser("40001")},
		{"wrapped 40001", fmt.Errorf("claim: %w", &pq.Error{Code: "40001"}), ser("40001")},
		{"joined 40P01", errors.Join(errors.New("x"), sqlStateErr("40P01")), ser("40P01")},
		{"40003 is not retried", &pq.Error{Code: "40003"}, other("40003")},
		{"40002 integrity constraint", &pq.Error{Code: "40002"}, other("40002")},
		{"08000", &pq.Error{Code: "08000"}, conn("08000")},
		{"08006", sqlStateErr("08006"), conn("08006")},
		{"08P01 protocol violation", &pq.Error{Code: "08P01"}, conn("08P01")},
		{"57P01 admin shutdown", sqlStateErr("57P01"), conn("57P01")},
		{"57P02 crash shutdown", &pq.Error{Code: "57P02"}, conn("57P02")},
		{"57P03 cannot connect now", &pq.Error{Code: "57P03"}, conn("57P03")},
		{"25006 read-only transaction (a standby)", &pq.Error{Code: "25006"}, conn("25006")},
		{"pgx-style 25006", sqlStateErr("25006"), conn("25006")},
		{"25001 active transaction is not a standby's", &pq.Error{Code: "25001"}, other("25001")},
		{"57014 query canceled", &pq.Error{Code: "57014"}, other("57014")},
		{"55P03 lock timeout", &pq.Error{Code: "55P03"}, dialect.Class{Kind: dialect.KindLockTimeout, Code: "55P03"}},
		{"42P01 undefined table", sqlStateErr("42P01"), dialect.Class{Kind: dialect.KindUndefinedTable, Code: "42P01"}},
		{"23505 unique violation", &pq.Error{Code: "23505"}, other("23505")},
		{"short code starting 08", sqlStateErr("08"), other("08")},
		{"empty code", sqlStateErr(""), other("")},
		{"driver.ErrBadConn", driver.ErrBadConn, conn("")},
		{"wrapped ErrBadConn", fmt.Errorf("commit: %w", driver.ErrBadConn), conn("")},
		{"io.EOF", io.EOF, conn("")},
		{"io.ErrUnexpectedEOF", io.ErrUnexpectedEOF, conn("")},
		{"ECONNRESET", &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}, conn("")},
		{"EPIPE", fmt.Errorf("write: %w", syscall.EPIPE), conn("")},
		{"net.ErrClosed", net.ErrClosed, conn("")},
		{"net.OpError", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, conn("")},
		{"pgx conn closed (not safe to retry)", fmt.Errorf("commit: %w", safeToRetryErr{false}), conn("")},
		{"pgx write failed (safe to retry)", safeToRetryErr{true}, conn("")},
		{"SQLSTATE beats transport", fmt.Errorf("%w: %w", io.EOF, &pq.Error{Code: "23505"}), other("23505")},
		{"context canceled", context.Canceled, other("")},
		{"deadline exceeded", context.DeadlineExceeded, other("")},
		{"a message without an SQLSTATE is not parsed", errors.New("pq: could not serialize access due to concurrent update (40001) connection reset by peer"), other("")},
		{"pq 0A000 BEGIN READ WRITE on a standby", &pq.Error{Code: "0A000", Message: "cannot set transaction read-write mode during recovery"}, conn("0A000")},
		{"pgx-style 0A000 SERIALIZABLE on a standby", msgStateErr{"0A000", "ERROR: cannot use serializable mode in a hot standby (SQLSTATE 0A000)"}, conn("0A000")},
		{"0A000 a feature the server lacks", &pq.Error{Code: "0A000", Message: "cannot use column reference in DEFAULT expression"}, other("0A000")},
		{"0A000 with a translated message", &pq.Error{Code: "0A000", Message: "no se puede poner el modo de transacción en lectura/escritura durante la recuperación"}, other("0A000")},
		{"lib/pq: no host is writable", fmt.Errorf("pq: could not connect to any of the hosts:\n%w", errors.Join(
			fmt.Errorf("connecting to 127.0.0.1:5433: %w", errors.New("server is in hot standby mode")),
			fmt.Errorf("connecting to 127.0.0.1:5434: %w", errors.New("session is read-only")))), conn("")},
		{"pgx: no host is writable", fmt.Errorf("failed to connect: %w", errors.Join(
			fmt.Errorf("ValidateConnect failed: %w", errors.New("read only connection")))), conn("")},
		{"pgx: standby refused for primary", fmt.Errorf("ValidateConnect failed: %w", errors.New("server is in standby mode")), conn("")},
		{"a refusal's words inside another message", errors.New("cache: read only connection to replica"), other("")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := d.Classify(c.err); got != c.want {
				t.Errorf("Classify(%v) = %+v, want %+v", c.err, got, c.want)
			}
		})
	}
}

func TestKindAndClass(t *testing.T) {
	for k, want := range map[dialect.Kind]string{
		dialect.KindOther: "other", dialect.KindSerialization: "serialization", dialect.KindConnection: "connection",
		dialect.KindLockTimeout: "lock_timeout", dialect.KindUndefinedTable: "undefined_table", dialect.Kind(99): "unknown",
	} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
		retryable := k == dialect.KindSerialization || k == dialect.KindConnection
		if got := (dialect.Class{Kind: k}).Retryable(); got != retryable {
			t.Errorf("Class{%v}.Retryable() = %v", k, got)
		}
	}
}

func TestTxFenceSQLGolden(t *testing.T) {
	d := postgres.New()
	var b strings.Builder
	for _, w := range []time.Duration{0, -time.Second, 50 * time.Millisecond, 1500 * time.Microsecond} {
		fmt.Fprintf(&b, "-- fence, lock wait %v\n%s;\n\n", w, d.TxFenceSQL(w))
	}
	for _, tb := range tables {
		for _, part := range []bool{false, true} {
			for _, horizon := range []bool{false, true} {
				fmt.Fprintf(&b, "-- table %q.%q partitioned %v horizon %v\n%s;\n\n", tb.Schema, tb.Name, part, horizon, d.TxFencedClaimSQL(tb, part, horizon))
			}
		}
	}
	fmt.Fprintf(&b, "-- check\n%s;\n", d.TxFenceCheckSQL())
	golden.Compare(t, filepath.Join("testdata", "tx_fence_sql.golden"), b.String())
}

// TestOrderSQLGolden covers the dialect.Orderer statements.
func TestOrderSQLGolden(t *testing.T) {
	golden.Compare(t, filepath.Join("testdata", "order_sql.golden"), golden.Orderer(postgres.New(), tables...))
}
