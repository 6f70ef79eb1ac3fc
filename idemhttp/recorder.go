package idemhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// ErrResponseTooLarge is returned by the handler's Write when the response
// body would exceed the limit of WithMaxResponseBody. The handler's
// transaction then rolls back and the client gets a 500.
var ErrResponseTooLarge = errors.New("idemhttp: response body larger than the stored limit")

// recorder is the http.ResponseWriter a protected handler writes to: it
// keeps status, header and body until the claim's transaction has
// committed. It implements neither http.Flusher nor http.Hijacker, and has
// no Unwrap method, on purpose: nothing may reach the client before the
// commit, so http.ResponseController's Flush, Hijack and deadline methods
// return an error matching http.ErrNotSupported.
//
// Otherwise it records the response net/http's own ResponseWriter would
// send: the header as it was when the status was written (fields set later
// are not sent), no body for a status that has none (Write returns
// http.ErrBodyNotAllowed), a status outside 100–999 a panic in the
// handler, and a Content-Type sniffed by finish under net/http's rules.
type recorder struct {
	header   http.Header // the handler's, from Header
	sent     http.Header // a copy of header when the status was written
	status   int
	body     []byte
	max      int
	overflow bool
}

func newRecorder(max int) *recorder {
	return &recorder{header: http.Header{}, max: max}
}

// Header returns the header the response will carry.
func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the status and the header as it is now; the first
// status wins, and informational (1xx) statuses are dropped: they cannot be
// sent before the commit. Like net/http's, it panics on a code outside
// 100–999, in the handler, so nothing of the request commits.
func (r *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if r.status != 0 || code < 200 {
		return
	}
	r.status = code
	r.sent = r.header.Clone()
}

// Write appends to the body, up to the limit.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !bodyAllowed(r.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if len(r.body)+len(p) > r.max {
		r.overflow = true
		return 0, ErrResponseTooLarge
	}
	r.body = append(r.body, p...)
	return len(p), nil
}

// finish ends the response once the handler has returned: a 200 when the
// handler wrote no status, and, as net/http does, a Content-Type sniffed
// from the body's first bytes when the header has no Content-Type field
// (an empty one included), no Content-Encoding and no Transfer-Encoding,
// and the status has a body. It is stored with the response, so a replay
// carries the same one.
func (r *recorder) finish() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	_, haveType := r.sent["Content-Type"]
	if !haveType && r.sent.Get("Content-Encoding") == "" && r.sent.Get("Transfer-Encoding") == "" && len(r.body) > 0 {
		r.sent.Set("Content-Type", http.DetectContentType(r.body))
	}
}

// bodyAllowed reports whether a response of status has a body, as net/http
// decides it.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// stored returns what is kept of the finished response: the chosen header
// fields only.
func (r *recorder) stored(fp []byte, names []string) (stored, error) {
	h := map[string][]string{}
	for _, n := range names {
		if vs, ok := r.sent[n]; ok {
			h[n] = vs
		}
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return stored{}, err
	}
	body := r.body
	if body == nil {
		body = []byte{}
	}
	return stored{fingerprint: fp, status: r.status, header: hj, body: body}, nil
}

// writeTo sends the finished live response: every header field the handler
// had set when it wrote the status.
func (r *recorder) writeTo(w http.ResponseWriter) {
	send(w, r.sent, r.status, r.body)
}

// replay sends a stored response, with ReplayedHeader.
func replay(w http.ResponseWriter, s stored) error {
	var h http.Header
	if err := json.Unmarshal(s.header, &h); err != nil {
		return err
	}
	if h == nil {
		h = http.Header{}
	}
	h.Set(ReplayedHeader, "true")
	send(w, h, s.status, s.body)
	return nil
}

// send writes a whole response to w: its header fields, a Content-Length
// when the status has a body, the status and the body.
func send(w http.ResponseWriter, h http.Header, status int, body []byte) {
	dst := w.Header()
	for k, vs := range h {
		dst[k] = vs
	}
	if bodyAllowed(status) {
		dst.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if len(body) > 0 && bodyAllowed(status) {
		_, _ = w.Write(body)
	}
}

// problem writes an RFC 9457 problem+json response.
func problem(w http.ResponseWriter, status int, detail string) {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{"about:blank", http.StatusText(status), status, detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
