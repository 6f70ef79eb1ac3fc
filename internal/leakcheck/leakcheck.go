// Package leakcheck generates connection strings that carry a password, in
// every form the ops CLI (cmd/idempotent) and the demo (examples/loyalty)
// take or may be given by mistake, and finds any piece of that password in
// what a command printed. Their tests run every string through every
// command, flag and environment variable that takes one.
package leakcheck

import (
	"net/url"
	"regexp"
	"strings"
)

// A DSN is a generated connection string.
type DSN struct {
	// Form names the template and the password, for a failure message.
	Form string
	// Value is the connection string.
	Value string
	// Server is the server the form is meant for: "postgres", "mysql", or
	// "" for a form that names none.
	Server string
}

// Every password is made of marker tokens (Qk1v, Qk2v, …) joined by the
// characters that break parsers or redaction; Leaks finds any marker, so a
// password printed in part, escaped or not, is found too.
var passwords = []string{
	"Qk1vQk2v",
	"Qk1v@Qk2v",
	"Qk1v:Qk2v",
	"Qk1v/Qk2v",
	"Qk1v Qk2v",
	"Qk1v%Qk2v",
	"Qk1v%41Qk2v",
	"Qk1v%zzQk2v",
	`Qk1v'Qk2v"Qk3v`,
	"Qk1v?Qk2v#Qk3v&Qk4v=",
	`Qk1v\Qk2v`,
	"Qk1v@",
	":Qk1v",
	"Qk1v)Qk2v(",
	"Qk1v@tcp(127.0.0.1:1)/Qk2v",
}

// forms are the templates: {P} is the password as it is, {U} escaped for
// a URL's user information, {Q} for a URL's query, {K} quoted for a
// key=value string; {port} is the server's port.
var forms = []string{
	// Postgres URLs, right and wrong.
	"postgres://bob:{U}@127.0.0.1:{port}/test?sslmode=disable",
	"postgresql://bob:{U}@127.0.0.1:{port}/test?sslmode=disable",
	"POSTGRES://bob:{U}@127.0.0.1:{port}/test?sslmode=disable",
	"postgres://bob:{P}@127.0.0.1:{port}/test?sslmode=disable",
	"postgres://bob:{U}@127.0.0.1:notaport/test",
	"postgres://bob:{U}@127.0.0.1:99999/test",
	"postgres://bob:{U}@/test?host=/nonexistent&sslmode=disable",
	"postgres://bob@127.0.0.1:{port}/test?sslmode=disable&password={Q}",
	"postgres://bob@127.0.0.1:{port}/test?password={P}&sslmode=disable",
	"postgres://bob:{U}@127.0.0.1:{port}/test?sslmode=bogus",
	" postgres://bob:{U}@127.0.0.1:{port}/test",
	"'postgres://bob:{U}@127.0.0.1:{port}/test'",
	"postgresql//bob:{P}@127.0.0.1:{port}/test",
	"postgress://bob:{P}@127.0.0.1:{port}/test",
	"postgres:/bob:{P}@127.0.0.1:{port}/test",
	"jdbc:postgresql://127.0.0.1:{port}/test?user=bob&password={P}",
	// Postgres key=value strings.
	"host=127.0.0.1 port={port} user=bob password={K} dbname=test sslmode=disable",
	"host=127.0.0.1 port={port} user=bob password={P} dbname=test sslmode=disable",
	"password={K} host=127.0.0.1 port={port} user=bob",
	"host=127.0.0.1 port=notaport user=bob password={K}",
	"host=127.0.0.1 port={port} user=bob password = {K} sslmode=bogus",
	// MySQL and MariaDB.
	"mysql://bob:{U}@127.0.0.1:{port}/test",
	"mysql://bob:{P}@127.0.0.1:{port}/test",
	"mysql://bob:{U}@127.0.0.1:notaport/test",
	"mysql://bob:{U}@tcp(127.0.0.1:{port})/test",
	"mysql://bob:{U}@127.0.0.1:{port}/test?tls=bogus",
	"mariadb://bob:{U}@127.0.0.1:{port}/test",
	"bob:{P}@tcp(127.0.0.1:{port})/test",
	"bob:{P}@tcp(127.0.0.1:notaport)/test",
	"bob:{P}@tcp(127.0.0.1:{port})/test?tls=bogus",
	"bob:{P}@tcp(127.0.0.1:{port}/test",
	"bob:{P}@unix(/nonexistent/mysqld.sock)/test",
	// No scheme at all.
	"bob:{P}@127.0.0.1:{port}/test",
	"bob:{P}@localhost/test",
	"bob:{P}@127.0.0.1",
	// SQLite, given a URL by mistake.
	"sqlite://bob:{U}@127.0.0.1:{port}/test",
	"sqlite:bob:{P}@127.0.0.1/test.db",
}

// Forms returns every form with every password, for a server on
// 127.0.0.1:port.
func Forms(port string) []DSN {
	var out []DSN
	for _, f := range forms {
		for _, p := range passwords {
			v := strings.NewReplacer(
				"{P}", p,
				"{U}", strings.TrimPrefix(url.UserPassword("", p).String(), ":"),
				"{Q}", url.QueryEscape(p),
				"{K}", "'"+strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(p)+"'",
				"{port}", port,
			).Replace(f)
			out = append(out, DSN{Form: f + " with password " + p, Value: v, Server: serverOf(f)})
		}
	}
	return out
}

// serverOf tells the server a form is meant for.
func serverOf(form string) string {
	switch {
	case strings.HasPrefix(form, "postgres"), strings.HasPrefix(form, "POSTGRES"), strings.Contains(form, "host="):
		return "postgres"
	case strings.HasPrefix(form, "mysql"), strings.HasPrefix(form, "mariadb"), strings.Contains(form, "@tcp("), strings.Contains(form, "@unix("):
		return "mysql"
	}
	return ""
}

// marker matches a piece of a generated password.
var marker = regexp.MustCompile(`Qk\d`)

// Leaks returns the pieces of a generated password found in out.
func Leaks(out string) []string {
	return marker.FindAllString(out, -1)
}
