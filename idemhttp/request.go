package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ScopeFunc returns the principal a request acts for: the client, account
// or tenant whose keys are a namespace of their own. Two requests with the
// same key and different scopes never meet: each has its own claim and its
// own stored response. An error means the request has no principal; it is
// answered 403, or 401 with the challenge of WithChallenge, and the handler
// does not run. The scope is stored in the claim table as it is returned,
// so return an account id, never a secret such as an API key (hash one if
// it is all you have).
type ScopeFunc func(r *http.Request) (string, error)

// GlobalScope is the ScopeFunc of a service with one client, or whose
// clients share one key space: every request is in the scope "". With it,
// a client that sends another client's key gets the other's stored response
// (or a 422), so use it only where no two clients must be kept apart.
func GlobalScope(*http.Request) (string, error) { return "", nil }

type ctxKey struct{}

// claimed is what the middleware puts in the context of a request it runs,
// on every Backend.
type claimed struct {
	key string
}

// KeyFromContext returns the claim's message key of a request the
// middleware is running — the scope and the client's idempotency key, as
// stored in the claim table — or "" for a context the middleware did not
// give. It is the same on every retry of the request, so it is the key to
// hand on to work that must itself be idempotent, such as an outbox row
// (outbox.Outbox.Enqueue's msgKey).
func KeyFromContext(ctx context.Context) string {
	c, _ := ctx.Value(ctxKey{}).(claimed)
	return c.key
}

// parseKey reads the idempotency key from the header's values. The draft
// makes the field a Structured Field String (RFC 8941), a quoted string;
// Stripe's clients send the bare key. Both are accepted: a value that
// begins with a double quote must be a valid sf-string and is unquoted,
// any other value is the key as sent. Only the white space HTTP itself
// strips around a field value, SP and HTAB (OWS, RFC 9110 section 5.5), is
// not part of the key: net/http's HTTP/1 reader has already removed it, and
// it is removed here for a value that arrives with it. Any other byte,
// Unicode white space such as U+00A0 included, is the key's, so two keys
// that differ by it are two claims.
func parseKey(values []string) (string, error) {
	if len(values) != 1 {
		return "", errors.New("the request has more than one idempotency key")
	}
	v := strings.Trim(values[0], ows)
	if !strings.HasPrefix(v, `"`) {
		if v == "" {
			return "", errors.New("the idempotency key is empty")
		}
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New("the idempotency key is not a valid structured-field string")
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("the idempotency key is not a valid structured-field string")
			}
			if b.Len() == 0 {
				return "", errors.New("the idempotency key is empty")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("the idempotency key is not a valid structured-field string")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the idempotency key is not a valid structured-field string")
}

// ows is the optional white space of HTTP around a field value (RFC 9110
// section 5.6.3): SP and HTAB.
const ows = " \t"

// claimKey is the claim's message key of key in scope: the scope's length,
// the scope and the key, so that no two (scope, key) pairs share a claim.
func claimKey(scope, key string) string {
	return strconv.Itoa(len(scope)) + ":" + scope + ":" + key
}

func checkScope(s string) error {
	if len(s) > MaxScopeBytes || !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("idemhttp: the ScopeFunc returned an invalid scope (%d bytes; it must be valid UTF-8 without NUL, at most %d bytes)", len(s), MaxScopeBytes)
	}
	return nil
}

// fingerprint is the SHA-256 of the request's method, path and query, the
// chosen header fields and the body, each part length-prefixed so that no
// two different requests frame the same bytes.
func fingerprint(r *http.Request, headers []string, body []byte) []byte {
	h := sha256.New()
	part := func(s []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write(s)
	}
	part([]byte(r.Method))
	part([]byte(r.URL.RequestURI()))
	for _, name := range headers {
		part([]byte(name))
		vs := r.Header.Values(name)
		part([]byte(strconv.Itoa(len(vs))))
		for _, v := range vs {
			part([]byte(v))
		}
	}
	part(body)
	return h.Sum(nil)
}
