package idemhttp

import (
	"encoding/json"
	"errors"
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
type recorder struct {
	header   http.Header
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

// WriteHeader records the status; the first one wins, and informational
// (1xx) statuses are dropped: they cannot be sent before the commit.
func (r *recorder) WriteHeader(code int) {
	if r.status != 0 || code < 200 {
		return
	}
	r.status = code
}

// Write appends to the body, up to the limit.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if len(r.body)+len(p) > r.max {
		r.overflow = true
		return 0, ErrResponseTooLarge
	}
	if _, ok := r.header["Content-Type"]; !ok && len(r.body) == 0 && len(p) > 0 {
		// As net/http would: sniffed once, from the first bytes, and then
		// stored, so a replay carries the same type.
		r.header.Set("Content-Type", http.DetectContentType(p))
	}
	r.body = append(r.body, p...)
	return len(p), nil
}

func (r *recorder) finalStatus() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// stored returns what is kept of the response: the chosen header fields only.
func (r *recorder) stored(fp []byte, names []string) (stored, error) {
	h := map[string][]string{}
	for _, n := range names {
		if vs, ok := r.header[n]; ok {
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
	return stored{fingerprint: fp, status: r.finalStatus(), header: hj, body: body}, nil
}

// writeTo sends the live response: every header field the handler set.
func (r *recorder) writeTo(w http.ResponseWriter) {
	dst := w.Header()
	for k, vs := range r.header {
		dst[k] = vs
	}
	dst.Set("Content-Length", strconv.Itoa(len(r.body)))
	w.WriteHeader(r.finalStatus())
	_, _ = w.Write(r.body)
}

// replay sends a stored response, with ReplayedHeader.
func replay(w http.ResponseWriter, s stored) error {
	var h map[string][]string
	if err := json.Unmarshal(s.header, &h); err != nil {
		return err
	}
	dst := w.Header()
	for k, vs := range h {
		dst[k] = vs
	}
	dst.Set("Content-Length", strconv.Itoa(len(s.body)))
	dst.Set(ReplayedHeader, "true")
	w.WriteHeader(s.status)
	_, _ = w.Write(s.body)
	return nil
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
