package deadletter

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/outbox"
)

// Kinds of the dead letters the library's adapters write through the
// outbox. cdkpubsub's kind is the one given to its WithDeadLetter: add it
// with WithKinds.
const (
	// KafkaKind is kafka.DeadLetterKind.
	KafkaKind = "kafka-dead-letter"
	// RedisStreamKind is redisstream.DeadLetterKind.
	RedisStreamKind = "redisstream-dead-letter"
	// NATSKind is nats.DeadLetterKind.
	NATSKind = "nats-dead-letter"
	// RabbitMQKind is rabbitmq.DeadLetterKind.
	RabbitMQKind = "rabbitmq-dead-letter"
)

// DefaultKinds are the dead-letter kinds a Store covers without WithKinds.
var DefaultKinds = []string{KafkaKind, RedisStreamKind, NATSKind, RabbitMQKind}

const (
	// MaxPage is the largest Filter.Limit.
	MaxPage = 1000
	// DefaultPage is the page size of a Filter whose Limit is 0.
	DefaultPage = 100
	// MaxActorBytes is the longest actor name Replay and Discard accept.
	MaxActorBytes = 200
	// ReplaySuffix is what ReplayKind adds to a dead letter's kind.
	ReplaySuffix = "-replay"
	// auditSuffix names the default audit table after the outbox's.
	auditSuffix = "_dead_letter_audit"
	// maxAuditName leaves room for the audit index's suffix within
	// Postgres's 63 bytes.
	maxAuditName = dialect.MaxIdentifierBytes - len("_dead_letter_id")
)

// Errors callers branch on.
var (
	// ErrNotFound is a Show of an id that is no dead letter (never was, or
	// discarded), or a Replay or Discard whose filter names ids that are
	// not all dead letters of the Store's kinds. Nothing was changed.
	ErrNotFound = errors.New("deadletter: no such dead letter")
	// ErrInvalidFilter is a filter, actor or id that cannot be right: the
	// error says which field and why. Nothing was sent to the database.
	ErrInvalidFilter = errors.New("deadletter: invalid filter")
)

// ReplayKind is the outbox kind of the replays of dead letters of kind: a
// Relay with the transport's replay sender registered for it (for example
// kafka.ReplaySender for kafka.ReplayKind) sends them back to their source.
func ReplayKind(kind string) string { return kind + ReplaySuffix }

// Store reads and operates the dead letters of an outbox table: rows whose
// kind is a dead-letter kind. It is safe for concurrent use.
type Store struct {
	db     *sql.DB
	table  dialect.Table
	audit  dialect.Table
	kinds  []string
	q      statements
	outbox []outbox.Option
}

// An Option configures a Store; New checks it.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	table, audit string
	kinds        []string
}

// WithTable sets the outbox table, as "table" or "schema.table": the one
// given to the adapters' outbox.New with outbox.WithTable. Default is
// outbox.DefaultTable.
func WithTable(name string) Option {
	return optionFunc(func(c *config) error { c.table = name; return nil })
}

// WithAuditTable sets the table where replays and discards are recorded, as
// "table" or "schema.table", at most 48 bytes a part. Default is the
// outbox table's name with "_dead_letter_audit" added, in its schema.
func WithAuditTable(name string) Option {
	return optionFunc(func(c *config) error { c.audit = name; return nil })
}

// WithKinds sets the outbox kinds that are dead letters, replacing
// DefaultKinds: add cdkpubsub's kind (the one given to its WithDeadLetter)
// to the defaults when it is in use. Each must be a valid outbox kind
// (outbox.CheckKind) short enough that ReplayKind's is too.
func WithKinds(kinds ...string) Option {
	return optionFunc(func(c *config) error {
		if len(kinds) == 0 {
			return errors.New("WithKinds: no kind")
		}
		for _, k := range kinds {
			if err := outbox.CheckKind(ReplayKind(k)); err != nil {
				return fmt.Errorf("WithKinds: %q: %w", k, err)
			}
		}
		c.kinds = slices.Clone(kinds)
		return nil
	})
}

// New returns a Store over the dead letters of the outbox table of db, a
// Postgres database (the outbox is Postgres only). It sends nothing to the
// database: call EnsureSchema (once, or on every start) before the first
// Replay or Discard.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("deadletter: New: nil *sql.DB")
	}
	cfg := config{table: outbox.DefaultTable, kinds: DefaultKinds}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("deadletter: New: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, fmt.Errorf("deadletter: New: %w", err)
		}
	}
	table, err := dialect.ParseTable(cfg.table)
	if err != nil {
		return nil, fmt.Errorf("deadletter: New: outbox %w", err)
	}
	audit := dialect.Table{Schema: table.Schema, Name: table.Name + auditSuffix}
	if cfg.audit != "" {
		if audit, err = dialect.ParseTable(cfg.audit); err != nil {
			return nil, fmt.Errorf("deadletter: New: audit %w", err)
		}
	}
	if len(audit.Name) > maxAuditName {
		return nil, fmt.Errorf("deadletter: New: audit table name %q is %d bytes, the limit is %d (choose one with WithAuditTable)", audit.Name, len(audit.Name), maxAuditName)
	}
	return &Store{
		db: db, table: table, audit: audit, kinds: cfg.kinds,
		q:      postgresStatements(table, audit),
		outbox: []outbox.Option{outbox.WithTable(table.String())},
	}, nil
}

// Table returns the outbox table's name, unquoted.
func (s *Store) Table() string { return s.table.String() }

// AuditTable returns the audit table's name, unquoted.
func (s *Store) AuditTable() string { return s.audit.String() }

// Kinds returns the dead-letter kinds the Store covers.
func (s *Store) Kinds() []string { return slices.Clone(s.kinds) }

// EnsureSchema creates the audit table if it does not exist. The outbox
// table is the outbox's (outbox.Outbox.EnsureSchema).
func (s *Store) EnsureSchema(ctx context.Context) error {
	err := func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		for _, q := range s.q.schema {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return tx.Commit()
	}()
	if err != nil {
		return fmt.Errorf("deadletter: ensure schema of %s: %w", s.audit, err)
	}
	return nil
}

// Filter selects dead letters. Its zero value selects every one; each set
// field narrows it.
type Filter struct {
	// Consumer is the consumer name of the outbox that wrote it.
	Consumer string
	// Topic is the source Kafka topic, Redis stream, NATS subject or AMQP
	// exchange (the queue, for the default exchange) of the poison message.
	Topic string
	// Key is the dead letter's message key in the outbox: a Kafka record's
	// "topic/partition/offset", a Redis entry's "stream/group/id", a NATS
	// message's "stream/consumer/sequence", a RabbitMQ message's
	// "queue/message key", a Go CDK message's key (or "sha256:…" of its
	// body).
	Key string
	// Reason is a text the error that made the message poison contains.
	Reason string
	// From and Before bound when it was dead-lettered: From <= time < Before.
	From, Before time.Time
	// IDs are outbox row ids. In Replay and Discard every one must be a
	// dead letter, or nothing is done (ErrNotFound).
	IDs []int64
	// After is the last ID of the previous page: List returns ids above it.
	After int64
	// Limit is the page size of List, 1 to MaxPage; 0 is DefaultPage.
	// Replay and Discard act on every match and ignore it.
	Limit int
}

// Empty reports whether f selects every dead letter: Replay and Discard
// refuse it.
func (f Filter) Empty() bool {
	return f.Consumer == "" && f.Topic == "" && f.Key == "" && f.Reason == "" && f.From.IsZero() && f.Before.IsZero() && len(f.IDs) == 0
}

// Check returns an error matching ErrInvalidFilter naming what is wrong
// with f, or nil: List, Replay and Discard call it before anything is sent
// to the database; a tool calls it to check its input first.
func (f Filter) Check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidFilter, fmt.Sprintf(format, args...))
	}
	for name, v := range map[string]string{"consumer": f.Consumer, "topic": f.Topic, "key": f.Key, "reason": f.Reason} {
		if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
			return bad("%s %q is not valid UTF-8 text", name, v)
		}
	}
	switch {
	case f.Limit < 0 || f.Limit > MaxPage:
		return bad("limit %d, want 1 to %d (0 for %d)", f.Limit, MaxPage, DefaultPage)
	case f.After < 0:
		return bad("after %d, want 0 or more", f.After)
	case !f.From.IsZero() && !f.Before.IsZero() && !f.From.Before(f.Before):
		return bad("from %s is not before %s", f.From.UTC().Format(time.RFC3339), f.Before.UTC().Format(time.RFC3339))
	}
	for _, id := range f.IDs {
		if id <= 0 {
			return bad("id %d, want a positive outbox row id", id)
		}
	}
	return nil
}

// args returns the parameters of list and lock.
func (f Filter) args(kinds []string, after int64, limit int) []any {
	text := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	at := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.UTC()
	}
	var ids any
	if len(f.IDs) > 0 {
		s := make([]string, len(f.IDs))
		for i, id := range f.IDs {
			s[i] = strconv.FormatInt(id, 10)
		}
		ids = strings.Join(s, ",")
	}
	return []any{strings.Join(kinds, ","), text(f.Consumer), text(f.Topic), text(f.Key), text(f.Reason), at(f.From), at(f.Before), ids, after, limit}
}

// Header is one header (Kafka), field (Redis Streams) or metadata entry
// (Go CDK) of a poison message.
type Header struct {
	Key, Value string
}

// DeadLetter is a poison message as its dead-letter row holds it.
type DeadLetter struct {
	// ID is the outbox row's id.
	ID int64
	// Consumer, Kind and Key are the row's: the consumer that dead-lettered
	// it, the dead-letter kind, the message key (see Filter.Key).
	Consumer, Kind, Key string
	// IdempotencyKey is the outbox row's: the dead-letter id header of the
	// copy in the dead-letter topic or stream.
	IdempotencyKey string
	// Reason is the error that made the message poison.
	Reason string
	// Source locates the original: "topic/partition/offset",
	// "stream/group/id", or the Go CDK's loggable id.
	Source string
	// Topic is the source topic or stream ("" for the Go CDK).
	Topic string
	// Destination is the dead-letter topic or stream it is sent to.
	Destination string
	// EventTime is the message's event time as the consumer read it: the
	// one a replay carries (zero when it had none).
	EventTime time.Time
	// DeadLetteredAt is when it was dead-lettered.
	DeadLetteredAt time.Time
	// State is the row's: "pending" (not yet in the dead-letter
	// destination), "sent" (there), or "dead" (the relay gave up sending
	// it; LastError says why).
	State string
	// Deliveries is how many times the transport had delivered the poison
	// message when it was dead-lettered, where the transport counts them
	// (NATS, RabbitMQ quorum queues); 0 where it does not say.
	Deliveries int
	// Attempts is how many times a relay tried to send it to the
	// dead-letter destination (the consumer's own attempts at the poison
	// message are not recorded).
	Attempts int
	// LastError is the relay's last error sending it, if any.
	LastError string
	// RecordKey is a Kafka record's key.
	RecordKey []byte
	// Headers are the message's headers in order (Kafka), or its fields
	// (Redis Streams) or metadata (Go CDK) sorted by key.
	Headers []Header
	// Payload is the message's value (Kafka) or body (Go CDK); a Redis
	// entry has none beside its fields.
	Payload []byte
	// Raw is the row's payload as stored.
	Raw json.RawMessage
}

// wire is the union of the dead-letter payloads of kafka, redisstream and
// cdkpubsub (their DeadLetter types), as JSON.
type wire struct {
	Error string `json:"error"`
	// kafka
	Topic       string `json:"topic"`
	SourceTopic string `json:"source_topic"`
	Partition   int32  `json:"partition"`
	Offset      int64  `json:"offset"`
	Key         []byte `json:"key"`
	Value       []byte `json:"value"`
	// Headers are a Kafka record's (a list of {Key, Value}) or an
	// adapter.DeadMessage's (a map of lists).
	Headers json.RawMessage `json:"headers"`
	// redisstream
	Stream       string            `json:"stream"`
	SourceStream string            `json:"source_stream"`
	Group        string            `json:"group"`
	ID           string            `json:"id"`
	Values       map[string]string `json:"values"`
	// nats and rabbitmq (adapter.DeadMessage)
	Destination    string `json:"destination"`
	DestinationKey string `json:"destination_key"`
	Source         string `json:"source"`
	SourceKey      string `json:"source_key"`
	Origin         string `json:"origin"`
	Deliveries     int    `json:"deliveries"`
	MessageID      string `json:"message_id"`
	// cdkpubsub (and Body of adapter.DeadMessage)
	Body       []byte            `json:"body"`
	Metadata   map[string]string `json:"metadata"`
	LoggableID string            `json:"loggable_id"`
}

// decode fills d's fields read from its payload. A payload of another
// shape leaves them empty: Raw still has it.
func (d *DeadLetter) decode() {
	var w wire
	if json.Unmarshal(d.Raw, &w) != nil {
		return
	}
	d.Reason = w.Error
	sorted := func(m map[string]string) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			d.Headers = append(d.Headers, Header{k, m[k]})
		}
	}
	switch {
	case w.SourceTopic != "":
		d.Topic, d.Destination = w.SourceTopic, w.Topic
		d.Source = fmt.Sprintf("%s/%d/%d", w.SourceTopic, w.Partition, w.Offset)
		d.RecordKey, d.Payload = w.Key, w.Value
		var hs []struct {
			Key   string
			Value []byte
		}
		_ = json.Unmarshal(w.Headers, &hs)
		for _, h := range hs {
			d.Headers = append(d.Headers, Header{h.Key, string(h.Value)})
		}
	case w.Origin != "":
		var h map[string][]string
		_ = json.Unmarshal(w.Headers, &h)
		d.Topic, d.Destination = cmp.Or(w.Source, w.SourceKey), w.Destination
		if w.DestinationKey != "" {
			d.Destination += "/" + w.DestinationKey
		}
		d.Source, d.Payload, d.Deliveries = w.Origin, w.Body, w.Deliveries
		if w.MessageID != "" {
			d.Headers = append(d.Headers, Header{"message-id", w.MessageID})
		}
		keys := make([]string, 0, len(h))
		for k := range h {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			for _, v := range h[k] {
				d.Headers = append(d.Headers, Header{k, v})
			}
		}
	case w.SourceStream != "":
		d.Topic, d.Destination = w.SourceStream, w.Stream
		d.Source = w.SourceStream + "/" + w.Group + "/" + w.ID
		sorted(w.Values)
	default:
		d.Source, d.Payload = w.LoggableID, w.Body
		sorted(w.Metadata)
	}
}

// scanRow reads a row of list or lock.
func scanRow(rows *sql.Rows) (DeadLetter, error) {
	var d DeadLetter
	var raw string
	var at, sent, dead sql.NullTime
	var ns sql.NullInt16
	var lastErr sql.NullString
	if err := rows.Scan(&d.ID, &d.Consumer, &d.Kind, &d.Key, &d.IdempotencyKey, &raw, &d.State, &d.Attempts,
		&d.DeadLetteredAt, &at, &ns, &lastErr, &sent, &dead); err != nil {
		return d, err
	}
	d.Raw, d.LastError = json.RawMessage(raw), lastErr.String
	if at.Valid {
		d.EventTime = at.Time.Add(time.Duration(ns.Int16)).UTC()
	}
	d.decode()
	return d, nil
}

// query runs list or lock on q (a *sql.DB or *sql.Tx).
func (s *Store) query(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, stmt string, args []any) ([]DeadLetter, error) {
	rows, err := q.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		d, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// List returns a page of the dead letters f selects, in id order (the
// order they were dead-lettered in), and the After of the next page: 0
// when this page is the last.
func (s *Store) List(ctx context.Context, f Filter) ([]DeadLetter, int64, error) {
	if err := f.Check(); err != nil {
		return nil, 0, err
	}
	limit := f.Limit
	if limit == 0 {
		limit = DefaultPage
	}
	out, err := s.query(ctx, s.db, s.q.list, f.args(s.kinds, f.After, limit+1))
	if err != nil {
		return nil, 0, fmt.Errorf("deadletter: list %s: %w", s.table, s.tableErr(err))
	}
	if len(out) <= limit {
		return out, 0, nil
	}
	return out[:limit], out[limit-1].ID, nil
}

// Show returns the dead letter with outbox row id, and what was done to it.
// An id that is no dead letter of the Store's kinds is ErrNotFound.
func (s *Store) Show(ctx context.Context, id int64) (DeadLetter, []Action, error) {
	if id <= 0 {
		return DeadLetter{}, nil, fmt.Errorf("%w: id %d, want a positive outbox row id", ErrInvalidFilter, id)
	}
	out, err := s.query(ctx, s.db, s.q.list, Filter{IDs: []int64{id}}.args(s.kinds, 0, 1))
	if err != nil {
		return DeadLetter{}, nil, fmt.Errorf("deadletter: show %d of %s: %w", id, s.table, s.tableErr(err))
	}
	if len(out) == 0 {
		return DeadLetter{}, nil, fmt.Errorf("%w: %d in %s", ErrNotFound, id, s.table)
	}
	hist, err := s.History(ctx, id)
	return out[0], hist, err
}

// Action is a replay or discard of a dead letter, as the audit table
// records it.
type Action struct {
	// ID is the audit row's id.
	ID int64
	// DeadLetterID is the dead letter's outbox row id.
	DeadLetterID int64
	// Action is "replay" or "discard".
	Action string
	// Actor is who did it, as given to Replay or Discard.
	Actor string
	// At is when, by the database's clock.
	At time.Time
	// ReplayKind and ReplayKey are a replay's outbox row: its kind and
	// idempotency key.
	ReplayKind, ReplayKey string
	// Reason is the dead letter's reason, kept with a discard.
	Reason string
}

// History returns what was done to dead letter id, oldest first; it
// outlives a discard.
func (s *Store) History(ctx context.Context, id int64) ([]Action, error) {
	rows, err := s.db.QueryContext(ctx, s.q.history, id)
	if err != nil {
		return nil, fmt.Errorf("deadletter: history of %d in %s: %w", id, s.audit, s.auditErr(err))
	}
	defer rows.Close()
	var out []Action
	for rows.Next() {
		a := Action{DeadLetterID: id}
		if err := rows.Scan(&a.ID, &a.Action, &a.Actor, &a.At, &a.ReplayKind, &a.ReplayKey, &a.Reason); err != nil {
			return nil, fmt.Errorf("deadletter: history of %d in %s: %w", id, s.audit, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deadletter: history of %d in %s: %w", id, s.audit, err)
	}
	return out, nil
}

// ErrNoAuditTable is a Replay, Discard or History before EnsureSchema made
// the audit table.
var ErrNoAuditTable = errors.New("deadletter: no audit table (run EnsureSchema, or idempotent dead-letters with -migrate)")

// auditErr adds ErrNoAuditTable to an error that says a table does not
// exist.
func (s *Store) auditErr(err error) error {
	var se interface{ SQLState() string }
	if errors.As(err, &se) && se.SQLState() == "42P01" {
		return fmt.Errorf("%w: %w", ErrNoAuditTable, err)
	}
	return err
}

// tableErr adds outbox.ErrNoTable to an error that says the outbox table
// does not exist.
func (s *Store) tableErr(err error) error {
	var se interface{ SQLState() string }
	if errors.As(err, &se) && se.SQLState() == "42P01" {
		return fmt.Errorf("%w: %s: %w", outbox.ErrNoTable, s.table, err)
	}
	return err
}

// checkActor checks the actor given to Replay or Discard.
func checkActor(actor string) error {
	switch {
	case strings.TrimSpace(actor) == "":
		return fmt.Errorf("%w: no actor: say who does it (a person or a tool), it is recorded", ErrInvalidFilter)
	case len(actor) > MaxActorBytes || !utf8.ValidString(actor) || strings.IndexByte(actor, 0) >= 0:
		return fmt.Errorf("%w: actor %.40q: want 1 to %d bytes of UTF-8 text", ErrInvalidFilter, actor, MaxActorBytes)
	}
	return nil
}

// locked checks f and actor, then, in a transaction, locks the dead letters
// f selects and calls each with them; it commits when each returns nil.
// Every id of f.IDs must be among them.
func (s *Store) locked(ctx context.Context, what string, f Filter, actor string, each func(*sql.Tx, []DeadLetter) error) error {
	if err := f.Check(); err != nil {
		return err
	}
	if err := checkActor(actor); err != nil {
		return err
	}
	if f.Empty() {
		return fmt.Errorf("%w: the filter selects every dead letter: name a consumer, topic, key, reason, time range or ids", ErrInvalidFilter)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("deadletter: %s: %w", what, err)
	}
	defer func() { _ = tx.Rollback() }()
	dls, err := s.query(ctx, tx, s.q.lock, f.args(s.kinds, 0, int(^uint32(0)>>1)))
	if err != nil {
		return fmt.Errorf("deadletter: %s in %s: %w", what, s.table, s.tableErr(err))
	}
	if len(f.IDs) > 0 {
		var missing []string
		for _, id := range f.IDs {
			if !slices.ContainsFunc(dls, func(d DeadLetter) bool { return d.ID == id }) {
				missing = append(missing, strconv.FormatInt(id, 10))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%w: %s in %s (or not matching the other conditions); nothing was done", ErrNotFound, strings.Join(missing, ", "), s.table)
		}
	}
	if err := each(tx, dls); err != nil {
		return fmt.Errorf("deadletter: %s in %s: %w", what, s.table, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("deadletter: %s in %s: commit: %w", what, s.table, err)
	}
	return nil
}

// record inserts an audit row in tx.
func (s *Store) record(ctx context.Context, tx *sql.Tx, d DeadLetter, action, actor, replayKind string) (Action, error) {
	a := Action{DeadLetterID: d.ID, Action: action, Actor: actor, ReplayKind: replayKind, Reason: d.Reason}
	var kind any
	if replayKind != "" {
		kind = replayKind
	}
	err := tx.QueryRowContext(ctx, s.q.record, d.ID, d.Consumer, d.Kind, d.Key, action, actor, d.Reason, kind).Scan(&a.ID, &a.At)
	if err != nil {
		return a, s.auditErr(err)
	}
	return a, nil
}

// Replay sends the dead letters f selects back to where they came from, and
// records each replay with actor: for each, in one transaction, an audit
// row and an outbox row of kind ReplayKind(kind) holding the dead letter's
// payload as it is, under its consumer and message key, with its event
// time. A Relay with the transport's replay sender (kafka.ReplaySender,
// redisstream.ReplaySender) then produces the original message — its key,
// headers and value — to its source topic or stream with that event time,
// so the consumer claims it under the original key and event time: a
// message applied since (or by an earlier replay) answers Duplicate, and
// one never applied is applied once. A dead letter may be replayed any
// number of times; each replay is a row of its own.
//
// f must not be Empty; a filter with IDs of which any is not a dead letter
// replays nothing (ErrNotFound). It returns the actions recorded, in id
// order.
func (s *Store) Replay(ctx context.Context, f Filter, actor string) ([]Action, error) {
	var done []Action
	err := s.locked(ctx, "replay", f, actor, func(tx *sql.Tx, dls []DeadLetter) error {
		obs := map[string]*outbox.Outbox{}
		for _, d := range dls {
			ob := obs[d.Consumer]
			if ob == nil {
				var err error
				if ob, err = outbox.New(s.db, d.Consumer, s.outbox...); err != nil {
					return fmt.Errorf("dead letter %d: %w", d.ID, err)
				}
				obs[d.Consumer] = ob
			}
			kind := ReplayKind(d.Kind)
			a, err := s.record(ctx, tx, d, "replay", actor, kind)
			if err != nil {
				return fmt.Errorf("dead letter %d: %w", d.ID, err)
			}
			opts := []outbox.EnqueueOption{outbox.WithKey(outbox.Key(d.Consumer, fmt.Sprintf("%s#replay-%d", d.Key, a.ID), kind))}
			if !d.EventTime.IsZero() {
				opts = append(opts, outbox.WithEventTime(d.EventTime))
			}
			if a.ReplayKey, err = ob.Enqueue(ctx, tx, d.Key, kind, d.Raw, opts...); err != nil {
				return fmt.Errorf("dead letter %d: %w", d.ID, err)
			}
			if _, err := tx.ExecContext(ctx, s.q.setReplayKey, a.ID, a.ReplayKey); err != nil {
				return fmt.Errorf("dead letter %d: %w", d.ID, err)
			}
			done = append(done, a)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

// Discard deletes the dead letters f selects from the outbox, and records
// each with actor and the dead letter's reason in the audit table, in one
// transaction. A discarded dead letter not yet sent to its dead-letter
// destination never will be; one already there stays there (the topic's
// or stream's own retention ends it). f must not be Empty; a filter with
// IDs of which any is not a dead letter discards nothing (ErrNotFound). It
// returns the actions recorded, in id order.
func (s *Store) Discard(ctx context.Context, f Filter, actor string) ([]Action, error) {
	var done []Action
	err := s.locked(ctx, "discard", f, actor, func(tx *sql.Tx, dls []DeadLetter) error {
		ids := make([]string, len(dls))
		for i, d := range dls {
			a, err := s.record(ctx, tx, d, "discard", actor, "")
			if err != nil {
				return fmt.Errorf("dead letter %d: %w", d.ID, err)
			}
			done = append(done, a)
			ids[i] = strconv.FormatInt(d.ID, 10)
		}
		if len(ids) == 0 {
			return nil
		}
		res, err := tx.ExecContext(ctx, s.q.remove, strings.Join(ids, ","), strings.Join(s.kinds, ","))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("count the deleted rows: %w", err)
		}
		if n != int64(len(ids)) {
			return fmt.Errorf("deleted %d of %d locked rows", n, len(ids))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}
