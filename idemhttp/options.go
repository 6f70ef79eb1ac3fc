package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"
)

// DefaultHeader is the request header that carries the idempotency key when
// WithHeader is not given: the field of the IETF draft
// draft-ietf-httpapi-idempotency-key-header, which Stripe uses too.
const DefaultHeader = "Idempotency-Key"

// ReplayedHeader is set to "true" on every response replayed from the
// response table, as Stripe's Idempotent-Replayed.
const ReplayedHeader = "Idempotent-Replayed"

// DefaultMaxRequestBody is the largest request body, in bytes, the
// middleware reads to fingerprint a request when WithMaxRequestBody is not
// given: 1 MiB.
const DefaultMaxRequestBody = 1 << 20

// DefaultMaxResponseBody is the largest response body, in bytes, the
// middleware stores when WithMaxResponseBody is not given: 1 MiB.
const DefaultMaxResponseBody = 1 << 20

// DefaultRetryAfter is the Retry-After of a 409 (a request of the same key
// in flight) and a 503 when WithRetryAfter is not given.
const DefaultRetryAfter = time.Second

// MaxScopeBytes is the longest scope a ScopeFunc may return.
const MaxScopeBytes = 256

// ErrUnsupportedDialect is returned by New for a Middleware whose dialect
// has no response-table statements in this package (it has them for
// postgres, mysql and sqlite).
var ErrUnsupportedDialect = errors.New("idemhttp: no response table for this dialect")

// ErrPartitioned is returned by New for a Middleware in partitioned mode
// (idempotent.WithDailyPartitions): a partitioned claim table places every
// claim by its producer's event time, and an HTTP request has none (the
// time it arrived is the time of processing, which differs on every retry).
// The error New returns also matches adapter.ErrNoProducerEventTime, as the
// broker adapters' does for the same reason.
var ErrPartitioned = errors.New("idemhttp: the claim table is partitioned by event day, and an HTTP request has no producer event time")

// ErrNoLockTimeout is returned by New for a Middleware without
// idempotent.WithLockTimeout (by pgxhttp.New, without
// idempgx.WithLockTimeout) on a dialect that can bound the claim's wait:
// without it a retry of a request still in flight waits for the first one
// to finish instead of being answered 409 within a bound.
var ErrNoLockTimeout = errors.New("idemhttp: the Middleware needs idempotent.WithLockTimeout")

// An Option configures New. A bad value is an error from New.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	header             string
	methods            map[string]bool
	optional           bool
	storedHeaders      []string
	fingerprintHeaders []string
	maxRequest         int64
	maxResponse        int
	retryAfter         time.Duration
	storeServerErrors  bool
	challenge          string
	table              string
	errorLog           func(*http.Request, error)
}

func defaultConfig() config {
	return config{
		header:             DefaultHeader,
		methods:            map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		storedHeaders:      canonical(DefaultStoredHeaders),
		fingerprintHeaders: canonical(DefaultFingerprintHeaders),
		maxRequest:         DefaultMaxRequestBody,
		maxResponse:        DefaultMaxResponseBody,
		retryAfter:         DefaultRetryAfter,
	}
}

// DefaultStoredHeaders are the response header fields stored with a
// response, and so replayed, when WithStoredHeaders is not given. Set-Cookie
// is never stored (WithStoredHeaders refuses it): a replay must not hand out
// the first response's session, and a cookie is a secret the response
// table should not keep.
var DefaultStoredHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified", "Cache-Control"}

// DefaultFingerprintHeaders are the request header fields that, with the
// method, the path and query and the body, make a request's fingerprint when
// WithFingerprintHeaders is not given.
var DefaultFingerprintHeaders = []string{"Content-Type"}

func canonical(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = textproto.CanonicalMIMEHeaderKey(n)
	}
	return out
}

func validName(n string) error {
	if n == "" || strings.ContainsAny(n, " \t\r\n:") {
		return fmt.Errorf("idemhttp: invalid header name %q", n)
	}
	return nil
}

// WithHeader sets the request header that carries the idempotency key.
// Default is DefaultHeader, "Idempotency-Key".
func WithHeader(name string) Option {
	return optionFunc(func(c *config) error {
		if err := validName(name); err != nil {
			return err
		}
		c.header = textproto.CanonicalMIMEHeaderKey(name)
		return nil
	})
}

// WithMethods sets the request methods the middleware protects; requests of
// other methods pass through untouched. Default is POST and PATCH, the
// methods that are not idempotent by definition (RFC 9110 section 9.2.2).
func WithMethods(methods ...string) Option {
	return optionFunc(func(c *config) error {
		if len(methods) == 0 {
			return errors.New("idemhttp: WithMethods needs at least one method")
		}
		c.methods = map[string]bool{}
		for _, m := range methods {
			if err := validName(m); err != nil {
				return fmt.Errorf("idemhttp: invalid method %q", m)
			}
			c.methods[strings.ToUpper(m)] = true
		}
		return nil
	})
}

// WithOptionalKey lets a request of a protected method without the key
// header through to the handler, unprotected. Default is to answer it 400.
func WithOptionalKey() Option {
	return optionFunc(func(c *config) error { c.optional = true; return nil })
}

// WithStoredHeaders sets the response header fields stored with a response
// and replayed with it; the first response carries every field the handler
// set. Set-Cookie is refused: it is never stored. Default is
// DefaultStoredHeaders.
func WithStoredHeaders(names ...string) Option {
	return optionFunc(func(c *config) error {
		for _, n := range names {
			if err := validName(n); err != nil {
				return err
			}
		}
		names = canonical(names)
		if slices.Contains(names, "Set-Cookie") {
			return errors.New("idemhttp: WithStoredHeaders: Set-Cookie is never stored (a replay must not hand out the first response's cookies)")
		}
		c.storedHeaders = names
		return nil
	})
}

// WithFingerprintHeaders sets the request header fields that are part of a
// request's fingerprint, with its method, path and query, and body.
// Default is DefaultFingerprintHeaders (Content-Type).
func WithFingerprintHeaders(names ...string) Option {
	return optionFunc(func(c *config) error {
		for _, n := range names {
			if err := validName(n); err != nil {
				return err
			}
		}
		c.fingerprintHeaders = canonical(names)
		return nil
	})
}

// WithMaxRequestBody sets the largest request body the middleware reads (to
// fingerprint it); a larger one is answered 413 without running the
// handler. Default is DefaultMaxRequestBody (1 MiB).
func WithMaxRequestBody(n int64) Option {
	return optionFunc(func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("idemhttp: WithMaxRequestBody(%d): must be positive", n)
		}
		c.maxRequest = n
		return nil
	})
}

// WithMaxResponseBody sets the largest response body the middleware stores.
// A handler that writes more gets ErrResponseTooLarge from Write, its
// transaction rolls back, and the client gets a 500. Default is
// DefaultMaxResponseBody (1 MiB).
func WithMaxResponseBody(n int) Option {
	return optionFunc(func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("idemhttp: WithMaxResponseBody(%d): must be positive", n)
		}
		c.maxResponse = n
		return nil
	})
}

// WithRetryAfter sets the Retry-After of a 409 answered to a request whose
// key is in flight, and of a 503. Default is DefaultRetryAfter (1s); it is
// sent in whole seconds, at least 1.
func WithRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idemhttp: WithRetryAfter(%v): must be positive", d)
		}
		c.retryAfter = d
		return nil
	})
}

// WithStoredServerErrors stores 5xx responses and commits the handler's
// transaction with them, as Stripe does, so a retry replays the error.
// Default is to roll a 5xx back with its effects and store nothing: the key
// is free and a retry runs the handler again, which is safe because nothing
// of the failed attempt was committed. Use this option only for handlers
// whose 5xx follows effects outside the database that must not repeat.
func WithStoredServerErrors() Option {
	return optionFunc(func(c *config) error { c.storeServerErrors = true; return nil })
}

// WithChallenge sets the WWW-Authenticate challenge, such as
// `Bearer realm="orders"`, of the answer to a request whose ScopeFunc
// returns an error: with it that answer is 401 Unauthorized, carrying the
// challenge. Default is none, and the answer is 403 Forbidden: RFC 9110
// requires a 401 to carry a challenge, and only the service knows its
// authentication scheme.
func WithChallenge(challenge string) Option {
	return optionFunc(func(c *config) error {
		if strings.Trim(challenge, " \t") == "" || strings.ContainsFunc(challenge, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
			return fmt.Errorf("idemhttp: WithChallenge(%q): not a WWW-Authenticate field value", challenge)
		}
		c.challenge = challenge
		return nil
	})
}

// WithResponseTable sets the response table, as "table" or "schema.table"
// (lower-case letters, digits and _). Default is the claim table's name
// followed by "_http", in the claim table's schema.
func WithResponseTable(name string) Option {
	return optionFunc(func(c *config) error { c.table = name; return nil })
}

// WithErrorLog sets a function told of every error the middleware answers
// with a 5xx of its own (a database failure, an oversized response, a
// scope function's invalid scope). Default is none.
func WithErrorLog(f func(r *http.Request, err error)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("idemhttp: WithErrorLog(nil)")
		}
		c.errorLog = f
		return nil
	})
}
