package idempgx

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent/dialect"
)

// Queued effects.
//
// A handler queues with Queue the statements whose results it does not
// read; the middleware sends them with the statement that follows them
// anyway, in the same round trip: on the single path with COMMIT, in a
// coalesced group with the next message's claim (the last message's with
// COMMIT). A statement the handler runs at once through its pgx.Tx (Exec,
// Query, QueryRow, SendBatch, CopyFrom, Begin) first sends what it queued,
// so that the handler's statements, queued or not, apply in the order it
// gave them, and an immediate statement sees the queued ones' work; so
// does tx.Conn(), before it returns the connection.

// queued is a statement a handler queued.
type queued struct {
	sql  string
	args []any
}

// ErrNotQueueable reports a Queue call the middleware refuses: a
// transaction that is not a handler's claim transaction (or is one of its
// savepoints), a handler that has returned, or a statement that would end
// or nest the transaction. Nothing was queued.
var ErrNotQueueable = errors.New("idempgx: the statement cannot be queued")

// Queue queues sql with args in tx, the transaction a Middleware handed to
// a handler, to run after the statements the handler ran or queued before
// it and before those it runs or queues after it, in the claim's
// transaction: it is sent with the middleware's next statement (COMMIT, or
// in a coalesced group the next message's claim), in the same round trip,
// so a handler that only queues costs no round trip of its own. Its result
// is not read; its failure (a constraint violation, say) is the handler's
// own failure, reported as ProcessMessage reports a handler's error,
// after the handler has returned: a handler that must see a statement's
// result or error runs it at once with tx.Exec or tx.QueryRow instead, and
// a statement run at once sends every statement queued before it first
// (one round trip), whose failure it then returns.
//
// Queue refuses (an error matching ErrNotQueueable) a statement beginning
// with a transaction command (BEGIN, START, COMMIT, END, ROLLBACK, ABORT,
// SAVEPOINT, RELEASE, PREPARE TRANSACTION), a tx that is not the handler's
// own (a savepoint's, from tx.Begin, runs its statements at once), and a
// call after the handler returned. tx.Conn() sends what was queued before
// it returns the connection.
func Queue(tx pgx.Tx, sql string, args ...any) error {
	t, ok := tx.(*claimTx)
	switch {
	case !ok:
		return fmt.Errorf("%w: Queue needs the pgx.Tx a Middleware handed to the handler, not a %T", ErrNotQueueable, tx)
	case t.closed:
		return fmt.Errorf("%w: the handler has returned: %w", ErrNotQueueable, pgx.ErrTxClosed)
	}
	if w := txCommand(sql); w != "" {
		return fmt.Errorf("%w: %q is a transaction command (%s); the middleware begins and ends the transaction", ErrNotQueueable, sql, w)
	}
	t.queue = append(t.queue, queued{sql: sql, args: args})
	return nil
}

// txCommand returns the transaction command sql begins with, upper case,
// or "" when it begins with none. Leading white space and comments are
// skipped.
func txCommand(sql string) string {
	words := make([]string, 0, 2)
	s := sql
	for len(words) < 2 {
		s = strings.TrimLeft(s, " \t\r\n\f(")
		switch {
		case strings.HasPrefix(s, "--"):
			if i := strings.IndexByte(s, '\n'); i >= 0 {
				s = s[i+1:]
				continue
			}
			s = ""
		case strings.HasPrefix(s, "/*"):
			if i := strings.Index(s, "*/"); i >= 0 {
				s = s[i+2:]
				continue
			}
			s = ""
		}
		end := strings.IndexFunc(s, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_')
		})
		if end < 0 {
			end = len(s)
		}
		if end == 0 {
			break
		}
		words = append(words, strings.ToUpper(s[:end]))
		s = s[end:]
	}
	if len(words) == 0 {
		return ""
	}
	switch words[0] {
	case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE":
		return words[0]
	case "PREPARE":
		if len(words) > 1 && words[1] == "TRANSACTION" {
			return "PREPARE TRANSACTION"
		}
	}
	return ""
}

// pending is the statements that the member live[idx] of a coalesced
// group queued, not sent yet.
type pending struct {
	idx int
	qs  []queued
}

// queuePending adds ps's statements to b.
func queuePending(b *pgx.Batch, ps []pending) {
	for _, p := range ps {
		queueInto(b, p.qs)
	}
}

// readPending reads the results of ps's statements from br: the first
// failure, and the member whose statement it was.
func readPending(br pgx.BatchResults, ps []pending) (idx int, err error) {
	for _, p := range ps {
		if err := readQueued(br, p.qs); err != nil {
			return p.idx, err
		}
	}
	return -1, nil
}

// statements counts ps's statements.
func statements(ps []pending) int {
	n := 0
	for _, p := range ps {
		n += len(p.qs)
	}
	return n
}

// queueInto adds qs to b.
func queueInto(b *pgx.Batch, qs []queued) {
	for _, q := range qs {
		b.Queue(q.sql, q.args...)
	}
}

// readQueued reads the results of n queued statements from br: the first
// failure, naming the statement, or nil.
func readQueued(br pgx.BatchResults, qs []queued) error {
	for i, q := range qs {
		if _, err := br.Exec(); err != nil {
			return queuedError(i, q, err)
		}
	}
	return nil
}

// queuedError is the failure of the i-th queued statement q.
func queuedError(i int, q queued, err error) error {
	return fmt.Errorf("idempgx: queued statement %d (%s): %w", i+1, abbrev(q.sql), err)
}

// abbrev is sql cut to a length an error message can carry.
func abbrev(sql string) string {
	const max = 80
	sql = strings.Join(strings.Fields(sql), " ")
	if len(sql) > max {
		return sql[:max] + "…"
	}
	return sql
}

// queuedClass classifies the failure of a queued statement sent after its
// handler returned: the loss of the connection when it is closed (its
// COMMIT may have landed: the attempt runs again, and finds its claim), a
// serialization failure or deadlock that failed the transaction, otherwise
// the handler's own error, as handlerClass has it.
func (m *Middleware) queuedClass(l *lease, err error) dialect.Class {
	if _, closed := m.status(l); closed {
		return dialect.Class{Kind: dialect.KindConnection}
	}
	return m.handlerClass(l, err)
}

// flush sends the statements t queued, in one round trip, before a
// statement the handler runs at once.
func (t *claimTx) flush(ctx context.Context) error {
	if len(t.queue) == 0 {
		return nil
	}
	qs := t.queue
	t.queue = nil
	var b pgx.Batch
	queueInto(&b, qs)
	br := t.a.l.c.SendBatch(ctx, &b)
	err := readQueued(br, qs)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("idempgx: queued statements: %w", cerr)
	}
	return err
}
