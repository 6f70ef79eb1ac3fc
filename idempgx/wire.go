package idempgx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// The claim's round trip on pgconn.
//
// On a connection that uses prepared statements (pgx's default exec mode),
// BEGIN, the lock timeout and the claim are prepared once per connection
// under fixed names; each delivery then writes Bind and Execute for each and
// one Sync straight to pgconn's frontend, in one write, and reads their
// results up to ReadyForQuery: one round trip, with none of pgx.Batch's
// per-query bookkeeping and no allocation of its own. A connection
// configured for the simple protocol or for unprepared statements (a
// transaction-mode pooler) goes through pgx.Batch instead, which honours its
// exec mode; both cost one round trip.
//
// The claim of a message with an event time is the statement with the
// retention horizon folded in (see horizon.go): its fence travels as a text
// timestamptz and its one row, the insert's count and the horizon, comes
// back as two binary int8s.

// wireClaimer is implemented by claim steps that can be sent on pgconn.
type wireClaimer interface {
	wire(ctx context.Context, raw *pgx.Conn) (claimed bool, err error)
}

// statementName returns a prepared statement name unique to sql.
func statementName(prefix, sql string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(sql))
	return fmt.Sprintf("idempgx_%s_%016x", prefix, h.Sum64())
}

// usesPrepared reports whether an exec mode prepares statements.
func usesPrepared(mode pgx.QueryExecMode) bool {
	switch mode {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe:
		return true
	}
	return false
}

// bytesOf returns s's bytes without copying; pgconn only copies them into
// its send buffer.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

func (c *claimOne) wire(ctx context.Context, raw *pgx.Conn) (bool, error) {
	m := c.m
	begin, err := raw.Prepare(ctx, m.beginName, m.beginStmt)
	if err != nil {
		return false, fmt.Errorf("idempgx: prepare begin: %w", err)
	}
	var lock *pgconn.StatementDescription
	if m.lockSQL != "" {
		if lock, err = raw.Prepare(ctx, m.lockName, m.lockSQL); err != nil {
			return false, fmt.Errorf("idempgx: prepare lock timeout: %w", err)
		}
	}
	name, text := m.claimName, m.claimSQL
	if c.fenced() {
		name, text = m.fencedName, m.fencedSQL
	}
	claim, err := raw.Prepare(ctx, name, text)
	if err != nil {
		return false, m.claimError(err, c.at)
	}
	w := &c.w
	vals := w.vals[:0]
	vals = append(vals, bytesOf(m.consumer), bytesOf(c.key))
	if c.day != "" {
		vals = append(vals, bytesOf(c.day))
	}
	var results []int16
	if f, ok := m.fence(c.at); ok && c.fenced() {
		vals = append(vals, f.AppendFormat(w.fence[:0], fenceLayout))
		results = binaryResults
	}
	pc := raw.PgConn()
	fe := pc.Frontend()
	w.bind = pgproto3.Bind{PreparedStatement: begin.Name}
	fe.SendBind(&w.bind)
	fe.SendExecute(&w.exec)
	if lock != nil {
		w.bind = pgproto3.Bind{PreparedStatement: lock.Name}
		fe.SendBind(&w.bind)
		fe.SendExecute(&w.exec)
	}
	w.bind = pgproto3.Bind{PreparedStatement: claim.Name, Parameters: vals, ResultFormatCodes: results}
	fe.SendBind(&w.bind)
	fe.SendExecute(&w.exec)
	fe.SendSync(&w.sync)
	// ctx is watched once for the whole round trip, not by each
	// ReceiveMessage (which would watch and unwatch it once per message,
	// allocating each time): if it ends, the connection's deadline cuts the
	// read short, and the connection, whose protocol state is then unknown,
	// is closed.
	rctx := ctx
	if ctx.Done() != nil {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		rctx = context.Background()
		netConn := pc.Conn()
		stop := context.AfterFunc(ctx, func() { _ = netConn.SetDeadline(time.Now()) })
		defer func() {
			if !stop() {
				closeBroken(raw)
			}
		}()
	}
	if err := fe.Flush(); err != nil {
		closeBroken(raw)
		return false, fmt.Errorf("idempgx: send claim: %w", ctxOr(ctx, err))
	}
	// One CommandComplete per statement — a fenced claim's preceded by its
	// one DataRow, a plain claim's tag counting the row it inserted — or an
	// ErrorResponse that skips the rest, then ReadyForQuery.
	var (
		n        int
		rows     int
		inserted int64
		hv       int64
		horizon  *int64 // &hv, when the claim read a horizon
		failed   error
	)
	for {
		msg, err := pc.ReceiveMessage(rctx)
		if err != nil {
			closeBroken(raw)
			return false, fmt.Errorf("idempgx: claim: %w", ctxOr(ctx, err))
		}
		switch msg := msg.(type) {
		case *pgproto3.DataRow:
			rows++
			if len(msg.Values) != 2 || len(msg.Values[0]) != 8 || (msg.Values[1] != nil && len(msg.Values[1]) != 8) {
				if failed == nil {
					failed = fmt.Errorf("a row of %d values, want the inserted count and the horizon as int8s", len(msg.Values))
				}
				continue
			}
			inserted = int64(binary.BigEndian.Uint64(msg.Values[0]))
			if v := msg.Values[1]; v != nil {
				hv = int64(binary.BigEndian.Uint64(v))
				horizon = &hv
			}
		case *pgproto3.CommandComplete:
			n++
			if n == w.statements(lock != nil) && !c.fenced() {
				inserted = pgconn.NewCommandTag(string(msg.CommandTag)).RowsAffected()
			}
		case *pgproto3.ErrorResponse:
			if failed == nil {
				failed = pgconn.ErrorResponseToPgError(msg)
				if msg.Code == "26000" {
					// Our prepared statements are gone from the session
					// (DEALLOCATE ALL or DISCARD ALL behind pgx's back):
					// retire the connection so that the pool replaces it.
					defer closeBroken(raw)
				}
			}
		case *pgproto3.ReadyForQuery:
			if failed != nil {
				if n < w.statements(lock != nil)-1 {
					return false, fmt.Errorf("idempgx: begin: %w", failed)
				}
				return false, m.claimError(failed, c.at)
			}
			if n != w.statements(lock != nil) {
				closeBroken(raw)
				return false, fmt.Errorf("idempgx: claim: %d results for %d statements", n, w.statements(lock != nil))
			}
			if c.fenced() && rows != 1 {
				return false, fmt.Errorf("idempgx: claim: %d rows, want 1", rows)
			}
			return m.horizonClaimed(c.key, c.at, inserted, horizon)
		}
	}
}

// wireMessages are the messages of one claim round trip, reused for each
// statement (the frontend encodes them as they are sent).
type wireMessages struct {
	bind  pgproto3.Bind
	exec  pgproto3.Execute
	sync  pgproto3.Sync
	vals  [4][]byte
	fence [32]byte // the fence's text, fenceLayout
}

// fenceLayout is the fence's text: a UTC timestamptz to the microsecond
// (truncated, as pgx's binary encoding of a time.Time truncates it).
const fenceLayout = "2006-01-02 15:04:05.999999-07"

// binaryResults asks for every result column in binary.
var binaryResults = []int16{pgx.BinaryFormatCode}

func (*wireMessages) statements(lock bool) int {
	if lock {
		return 3
	}
	return 2
}

// ctxOr returns err joined with ctx's error when ctx has ended: a read cut
// short by the context's deadline then matches context.Canceled or
// context.DeadlineExceeded, as pgconn's own reads do.
func ctxOr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return errors.Join(cerr, err)
	}
	return err
}

// closeBroken closes a connection whose protocol state is unknown after a
// failed write or read, so that the pool discards it.
func closeBroken(raw *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = raw.Close(ctx)
}
