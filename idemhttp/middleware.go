package idemhttp

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/dialect"
)

// Middleware is the Idempotency-Key middleware of one set of handlers, on
// the claim table of one idempotent.Middleware (New) or idempgx.Middleware
// (pgxhttp.New) and a response table beside it. It is safe for concurrent use; Wrap is its func(http.Handler)
// http.Handler.
type Middleware struct {
	b     Backend
	core  *idempotent.Middleware // b.Core(): key checks
	claim idempotent.Config      // b.Config()
	db    *sql.DB                // the response table's pool
	scope ScopeFunc
	// global says scope is GlobalScope: "" is the one scope on purpose,
	// not a request without a principal.
	global bool
	cfg    config
	resp   dialect.Table // the response table
	table  string        // resp.String()
	sql    statements
	// replays weighs recent replays against first requests, to decide
	// whether a request reads its stored response before claiming (see
	// readFirst): plus replayWeight for each request answered with a
	// stored response, up to maxReplayScore, minus one for each that was
	// not, down to 0.
	replays atomic.Int32
	// alwaysReadFirst makes every request read first (tests).
	alwaysReadFirst bool
}

// replayWeight and maxReplayScore set the replays score: a replay read
// first costs one round trip instead of the claim's three, and a first
// request read first pays one more, so reading first pays while replays
// are more than a third of requests, which is when the score, up by 2
// for a replay and down by 1 for any other request, stays above 0. After a
// run of replays ends, at most maxReplayScore requests read first in vain.
const (
	replayWeight   = 2
	maxReplayScore = 16
)

// readFirst reports whether a request reads its stored response before
// claiming: while replays have been frequent enough to pay for it.
func (m *Middleware) readFirst() bool {
	return m.alwaysReadFirst || m.replays.Load() > 0
}

// counted adds the end of a request to the replays score: replayed or not.
func (m *Middleware) counted(replayed bool) {
	for {
		n := m.replays.Load()
		next := max(n-1, 0)
		if replayed {
			next = min(n+replayWeight, maxReplayScore)
		}
		if next == n || m.replays.CompareAndSwap(n, next) {
			return
		}
	}
}

// New returns the middleware for the claims of mw — the claim table, the
// consumer name (use one of its own for the HTTP service, shared by no
// broker consumer), the retry policy, the lock timeout — on the database
// mw was created on. scope names the principal of each request
// (GlobalScope for none); it is required, because the right answer depends
// on how the service authenticates, and a wrong default would let one
// client read another's responses. A request whose scope is "" is refused
// as one without a principal, unless scope is GlobalScope itself.
//
// New refuses a partitioned claim table (ErrPartitioned), a dialect without
// response-table statements (ErrUnsupportedDialect), and, on a dialect that
// can bound the claim's wait, a Middleware without
// idempotent.WithLockTimeout (ErrNoLockTimeout). It sends nothing to the
// database; call EnsureSchema (and mw's) before the first request.
func New(mw *idempotent.Middleware, scope ScopeFunc, opts ...Option) (*Middleware, error) {
	if mw == nil {
		return nil, errors.New("idemhttp: New needs an idempotent.Middleware")
	}
	return NewOn(sqlBackend{mw}, scope, opts...)
}

// NewOn returns the middleware on the claims of b, with the rules and
// refusals of New, the lock timeout being b.Config().LockTimeout. Services
// call New (database/sql) or pgxhttp.New (pgx), which build the Backend;
// NewOn is what such a constructor calls.
func NewOn(b Backend, scope ScopeFunc, opts ...Option) (*Middleware, error) {
	if b == nil || b.Core() == nil {
		return nil, errors.New("idemhttp: NewOn needs a Backend with its Core")
	}
	path, err := adapter.NewPath(b.Core())
	if err != nil {
		return nil, fmt.Errorf("idemhttp: %w", err)
	}
	db := path.DB()
	if scope == nil {
		return nil, errors.New("idemhttp: New needs a ScopeFunc (GlobalScope for a service whose clients share one key space)")
	}
	claim := b.Config()
	if claim.Partitioned() {
		return nil, fmt.Errorf("%w (%w)", ErrPartitioned, adapter.ErrNoProducerEventTime)
	}
	if claim.LockTimeout <= 0 && claim.Dialect.LockTimeoutSQL(time.Second) != "" {
		return nil, fmt.Errorf("%w: without it a retry of a request still in flight waits for it instead of getting a 409", ErrNoLockTimeout)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	st, table, err := Tables{Claims: claim.Table, Responses: cfg.table}.parse(claim.Dialect)
	if err != nil {
		return nil, err
	}
	resp, _ := dialect.ParseTable(table) // parse checked it
	// GlobalScope is told by its code pointer: a function value is
	// comparable no other way.
	global := reflect.ValueOf(scope).Pointer() == reflect.ValueOf(GlobalScope).Pointer()
	return &Middleware{b: b, core: b.Core(), claim: claim, db: db, scope: scope, global: global, cfg: cfg, resp: resp, table: table, sql: st}, nil
}

// Table returns the response table's name.
func (m *Middleware) Table() string { return m.table }

// errServerResponse rolls back a 5xx the handler answered.
var errServerResponse = errors.New("idemhttp: the handler answered a server error")

// replayAttempts bounds the claim-then-read loop: a claim found whose
// response was cleaned up between the two is claimed again.
const replayAttempts = 3

// Wrap returns next protected by the middleware. A request of a protected
// method with a key runs next at most once per (scope, key) to a committed
// end; see the package documentation for every case.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.cfg.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		values := r.Header.Values(m.cfg.header)
		if len(values) == 0 {
			if m.cfg.optional {
				next.ServeHTTP(w, r)
				return
			}
			problem(w, http.StatusBadRequest, "this request needs an "+m.cfg.header+" header")
			return
		}
		key, err := parseKey(values)
		if err != nil {
			problem(w, http.StatusBadRequest, err.Error())
			return
		}
		scope, err := m.scope(r)
		if err != nil || scope == "" && !m.global {
			// An empty scope is a request no one authenticated (a header
			// that was not there): with it, every such client would share
			// one key space and replay the others' responses.
			m.noPrincipal(w)
			return
		}
		if err := checkScope(scope); err != nil {
			m.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		msg := idempotent.Message{Key: claimKey(scope, key)}
		if err := m.core.CheckMessage(msg); err != nil {
			if errors.Is(err, idempotent.ErrInvalidKey) {
				problem(w, http.StatusBadRequest, "the idempotency key is not valid UTF-8 without NUL, or is too long")
				return
			}
			m.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.maxRequest))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				problem(w, http.StatusRequestEntityTooLarge, "the request body is larger than "+strconv.FormatInt(m.cfg.maxRequest, 10)+" bytes")
				return
			}
			problem(w, http.StatusBadRequest, "the request body could not be read")
			return
		}
		fp := fingerprint(r, m.cfg.fingerprintHeaders, body)
		// The claim's work does not end with the client's connection: the
		// effect and its response commit (a retry gets the replay) or not at
		// all (a retry runs the handler).
		ctx := context.WithoutCancel(r.Context())
		// While replays are frequent, a retry of a request that completed
		// is answered in one round trip, before any claim; a request it
		// does not answer goes to the claim, as does one whose read failed:
		// the claim is the authority, and reports a database that is down.
		if m.readFirst() {
			if s, found, err := m.completed(ctx, msg.Key); err == nil && found {
				m.counted(true)
				m.answer(w, r, s, fp)
				return
			}
		}
		replayed := false
		defer func() { m.counted(replayed) }()
		for range replayAttempts {
			var rec *recorder
			outcome, err := m.b.ProcessMessage(ctx, msg, func(ctx context.Context, exec Exec) error {
				rec = newRecorder(m.cfg.maxResponse)
				r2 := r.WithContext(context.WithValue(ctx, ctxKey{}, claimed{key: msg.Key}))
				r2.Body = io.NopCloser(bytes.NewReader(body))
				r2.ContentLength = int64(len(body))
				next.ServeHTTP(rec, r2)
				if rec.overflow {
					return ErrResponseTooLarge
				}
				rec.finish()
				if rec.status >= 500 && !m.cfg.storeServerErrors {
					return errServerResponse
				}
				s, err := rec.stored(fp, m.cfg.storedHeaders)
				if err != nil {
					return err
				}
				return m.put(ctx, exec, msg.Key, s)
			})
			switch {
			case errors.Is(err, errServerResponse):
				rec.writeTo(w)
				return
			case errors.Is(err, ErrResponseTooLarge):
				m.fail(w, r, http.StatusInternalServerError, fmt.Errorf("%w (%d bytes)", err, m.cfg.maxResponse))
				return
			case errors.Is(err, idempotent.ErrClaimBusy):
				m.retryAfter(w)
				problem(w, http.StatusConflict, "a request with this idempotency key is being processed; retry later")
				return
			case errors.Is(err, idempotent.ErrRetriesExhausted):
				m.retryAfter(w)
				m.fail(w, r, http.StatusServiceUnavailable, err)
				return
			case err != nil:
				m.fail(w, r, http.StatusInternalServerError, err)
				return
			case outcome == idempotent.Applied:
				rec.writeTo(w)
				return
			}
			s, found, err := m.get(ctx, msg.Key)
			if err != nil {
				m.fail(w, r, http.StatusInternalServerError, err)
				return
			}
			if !found {
				continue
			}
			replayed = true
			m.answer(w, r, s, fp)
			return
		}
		m.fail(w, r, http.StatusInternalServerError, fmt.Errorf("idemhttp: the claim of key %q has no stored response (is the consumer %q shared with something other than idemhttp?)", key, m.claim.Consumer))
	})
}

// answer answers a request with s, the stored response of its key: a 422
// when s answered another request (fingerprint fp differs), else s itself.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, s stored, fp []byte) {
	if !bytes.Equal(s.fingerprint, fp) {
		problem(w, http.StatusUnprocessableEntity, "this idempotency key was used with another request")
		return
	}
	if err := replay(w, s); err != nil {
		m.fail(w, r, http.StatusInternalServerError, fmt.Errorf("idemhttp: decode the stored header: %w", err))
	}
}

// noPrincipal answers a request whose ScopeFunc failed: 401 with the
// challenge of WithChallenge, 403 without one.
func (m *Middleware) noPrincipal(w http.ResponseWriter) {
	const detail = "the request has no principal to scope its idempotency key by"
	if m.cfg.challenge == "" {
		problem(w, http.StatusForbidden, detail)
		return
	}
	w.Header().Set("WWW-Authenticate", m.cfg.challenge)
	problem(w, http.StatusUnauthorized, detail)
}

func (m *Middleware) retryAfter(w http.ResponseWriter) {
	s := max(int64((m.cfg.retryAfter+time.Second-1)/time.Second), 1)
	w.Header().Set("Retry-After", strconv.FormatInt(s, 10))
}

// fail answers a 5xx of the middleware's own and tells the error log.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if m.cfg.errorLog != nil {
		m.cfg.errorLog(r, err)
	}
	detail := "the request could not be processed"
	if errors.Is(err, ErrResponseTooLarge) {
		detail = "the response is larger than the middleware stores; nothing was applied"
	}
	problem(w, status, detail)
}
