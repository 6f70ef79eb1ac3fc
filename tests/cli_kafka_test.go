package tests

import (
	"strings"
	"testing"
)

// TestCLIKafkaOffsets: "kafka-offsets reset" sets one partition's stored
// offset (creating the row, or moving it either way) and forgets the topic
// ID stored with it, saying what it was; "kafka-offsets list" prints the
// rows; a password in the DSN is never printed.
func TestCLIKafkaOffsets(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	bin := cliBinary(t)
	offsets := tempSchema(t, db) + ".offsets"
	ok := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := cliRun(t, bin, nil, append(args, "-dsn", pgDSN)...)
		if code != 0 || stderr != "" {
			t.Fatalf("idempotent %q: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
		}
		return stdout
	}
	ok("migrate", "-table", offsets+"_claims", "-kafka-offsets", offsets)
	if _, err := db.Exec(`INSERT INTO ` + offsets + ` (consumer, topic, partition, next_offset, topic_id) VALUES ('payments', 'orders', 1, 10, 'OLDTOPICID')`); err != nil {
		t.Fatal(err)
	}
	reset := func(partition, offset string) string {
		t.Helper()
		return ok("kafka-offsets", "reset", "-table", offsets, "-consumer", "payments", "-topic", "orders", "-partition", partition, "-offset", offset)
	}
	if out := reset("1", "0"); out != offsets+": consumer payments, topic orders partition 1 was at 10 (topic ID OLDTOPICID), now at 0\n" {
		t.Fatalf("reset printed %q", out)
	}
	if out := reset("2", "7"); out != offsets+": consumer payments, topic orders partition 2 had no stored offset, now at 7\n" {
		t.Fatalf("reset of a partition without a row printed %q", out)
	}
	var next int64
	var id *string
	if err := db.QueryRow(`SELECT next_offset, topic_id FROM `+offsets+` WHERE consumer = 'payments' AND topic = 'orders' AND partition = 1`).Scan(&next, &id); err != nil || next != 0 || id != nil {
		t.Fatalf("after the reset: next_offset %d, topic_id %v (%v); want 0 and NULL", next, id, err)
	}
	out := ok("kafka-offsets", "list", "-table", offsets, "-consumer", "payments")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "payments  orders  partition 1  next offset 0  topic ID -  updated ") ||
		!strings.HasPrefix(lines[1], "payments  orders  partition 2  next offset 7  topic ID -  updated ") || lines[2] != "2 stored offsets in "+offsets {
		t.Fatalf("list printed\n%s", out)
	}

	const secret = "Pa55w0rdX"
	code, stdout, stderr := cliRun(t, bin, nil, "kafka-offsets", "reset", "-dsn", "postgres://postgres:"+secret+"@127.0.0.1:1/x",
		"-table", offsets, "-consumer", "payments", "-topic", "orders", "-partition", "1", "-offset", "3")
	if code != 1 || strings.Contains(stdout+stderr, secret) || !strings.Contains(stderr, "xxxxx") {
		t.Fatalf("unreachable database: exit %d, stdout %q, stderr %q; want exit 1 and the password redacted", code, stdout, stderr)
	}
}
