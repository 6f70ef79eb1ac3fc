package seenredis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
)

// DefaultPrefix starts every key Seen writes when WithPrefix is not given.
// The scope's tag follows it (see Key), so the keys of different scopes
// never meet even under this shared prefix.
const DefaultPrefix = "idempotent:seen:"

// DefaultTimeout bounds each Redis call when WithTimeout is not given.
const DefaultTimeout = 50 * time.Millisecond

// Seen is an idempotent.Seen kept in Redis: one key per (scope, message
// key), written with SET … PX after the claim committed and read with
// EXISTS. The scope (idempotent.SeenScope: the claim table's database and
// its server's start, the table and the consumer) is always part of the
// key, so that Middlewares of one consumer name on different databases or
// tables — tenants, say — never answer for each other, nor a database
// restored or cloned for the original.
// Any Redis failure — down, slow beyond the timeout, evicted keys — is a
// miss: the delivery goes to the claim in the database, which stays the
// authority. It is safe for concurrent use.
type Seen struct {
	rdb     redis.UniversalClient
	prefix  string
	timeout time.Duration
	onError func(error)
}

var _ idempotent.SeenBatch = (*Seen)(nil)

// An Option configures a Seen.
type Option func(*Seen) error

// WithPrefix sets the prefix of every key, for a namespace of the
// application's own in a shared Redis (an ACL key pattern, say); the scope
// still follows it (see Key). Default is DefaultPrefix.
func WithPrefix(p string) Option {
	return func(s *Seen) error {
		s.prefix = p
		return nil
	}
}

// WithTimeout bounds each Redis call; a slower answer counts as a miss (or
// a record not made). d must be positive. Default is DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(s *Seen) error {
		if d <= 0 {
			return fmt.Errorf("seenredis: WithTimeout: %v is not a positive duration", d)
		}
		s.timeout = d
		return nil
	}
}

// WithErrorHandler sets a function told of every failed Redis call, for
// logging or metrics; the call itself still counts as a miss. Default is
// none.
func WithErrorHandler(f func(error)) Option {
	return func(s *Seen) error {
		if f == nil {
			return errors.New("seenredis: WithErrorHandler: nil function")
		}
		s.onError = f
		return nil
	}
}

// New returns a Seen on rdb (a *redis.Client, *redis.ClusterClient or
// *redis.Ring). It sends nothing.
func New(rdb redis.UniversalClient, opts ...Option) (*Seen, error) {
	if rdb == nil {
		return nil, errors.New("seenredis: New: nil client")
	}
	s := &Seen{rdb: rdb, prefix: DefaultPrefix, timeout: DefaultTimeout}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("seenredis: New: nil option")
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Prefix returns the prefix of every key of scope: the prefix (WithPrefix,
// or DefaultPrefix), the scope's tag — 32 hex digits of the SHA-256 of
// scope.String() — and a colon. Its keys match the pattern Prefix(scope)+"*",
// for clearing one scope's entries by hand (see docs/operations.md,
// "Pre-check and restores").
func (s *Seen) Prefix(scope idempotent.SeenScope) string {
	sum := sha256.Sum256([]byte(scope.String()))
	return s.prefix + hex.EncodeToString(sum[:16]) + ":"
}

// Key returns the Redis key of key in scope: Prefix(scope) and the key.
// Distinct scopes have distinct tags (a collision of 128 bits of SHA-256
// aside), and the tag has a fixed length, so no two pairs share a Redis
// key whatever bytes they hold.
func (s *Seen) Key(scope idempotent.SeenScope, key string) string {
	return s.Prefix(scope) + key
}

// Seen reports whether key was recorded in scope and has not expired. Any
// failure is false.
func (s *Seen) Seen(ctx context.Context, scope idempotent.SeenScope, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := s.rdb.Exists(ctx, s.Key(scope, key)).Result()
	if err != nil {
		s.fail(err)
		return false
	}
	return n == 1
}

// Record remembers key in scope for ttl, rounded down to whole
// milliseconds so that it never outlives the claim it stands for. A ttl under
// a millisecond records nothing. Failures are ignored (and reported to the
// error handler).
func (s *Seen) Record(ctx context.Context, scope idempotent.SeenScope, key string, ttl time.Duration) {
	ttl = ttl.Truncate(time.Millisecond)
	if ttl <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	if err := s.rdb.Set(ctx, s.Key(scope, key), "1", ttl).Err(); err != nil {
		s.fail(err)
	}
}

// SeenKeys reports, for each of keys, whether it was recorded in scope and
// has not expired: one pipelined round trip of EXISTS commands, which a
// cluster client splits by node. Any failure answers false for every key.
func (s *Seen) SeenKeys(ctx context.Context, scope idempotent.SeenScope, keys []string) []bool {
	hit := make([]bool, len(keys))
	if len(keys) == 0 {
		return hit
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	prefix := s.Prefix(scope)
	cmds := make([]*redis.IntCmd, len(keys))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Exists(ctx, prefix+k)
		}
		return nil
	})
	if err != nil {
		s.fail(err)
		return make([]bool, len(keys))
	}
	for i, c := range cmds {
		hit[i] = c.Val() == 1
	}
	return hit
}

// RecordKeys records every one of keys in scope as Record does, in one
// pipelined round trip of SET … PX commands.
func (s *Seen) RecordKeys(ctx context.Context, scope idempotent.SeenScope, keys []string, ttl time.Duration) {
	ttl = ttl.Truncate(time.Millisecond)
	if ttl <= 0 || len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	prefix := s.Prefix(scope)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Set(ctx, prefix+k, "1", ttl)
		}
		return nil
	})
	if err != nil {
		s.fail(err)
	}
}

func (s *Seen) fail(err error) {
	if s.onError != nil {
		s.onError(err)
	}
}
