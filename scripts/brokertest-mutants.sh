#!/usr/bin/env bash
# brokertest-mutants.sh [REF] [NAME...] — proves the adapters' conformance
# suite (package brokertest) catches broken adapters.
#
# It extracts the tree at REF (default HEAD) into a temporary directory —
# never touching the working tree —, and for each mutant applies its small
# edits (each an exact, single occurrence, or the mutant is reported "not
# applied"), runs that adapter's brokertest test with -failfast, restores
# the files, and prints a table: mutant → caught (the test failed), missed
# (it passed) or unbuilt (the mutant did not compile). With NAMEs, only
# those mutants run. Run it against the commit before a change to the suite
# to see which mutants the old suite missed.
#
# Not run by CI: each mutant costs one adapter's suite run (up to a few
# minutes on a loaded machine). It needs the servers of scripts/services.sh
# and python3.
set -u

ref=${1:-HEAD}
shift || true
only=" $* "
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/brokertest-mutants.XXXXXX)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$ref" | tar -x -C "$work" || exit 1
results=$work/.results
: >"$results"

export IDEMPOTENT_POSTGRES_DSN=${IDEMPOTENT_POSTGRES_DSN:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
export IDEMPOTENT_AMQP_URL=${IDEMPOTENT_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
export IDEMPOTENT_NATS_URL=${IDEMPOTENT_NATS_URL:-nats://127.0.0.1:4222}
export IDEMPOTENT_REDIS_ADDR=${IDEMPOTENT_REDIS_ADDR:-127.0.0.1:6379}
unset CI # a missing server skips a test rather than failing it: "caught" must mean the suite caught it

# edit FILE OLD NEW replaces the one occurrence of OLD in FILE with NEW.
edit() {
	python3 - "$work/$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:4]
s = open(path).read()
if s.count(old) != 1:
    sys.exit(f"{path}: {s.count(old)} occurrences of {old!r}")
open(path, "w").write(s.replace(old, new))
PY
}

# test MODULE -> the brokertest test of the adapter module.
testof() {
	case $1 in
	rabbitmq) echo '^TestRabbitMQBrokertest$' ;;
	watermill) echo '^TestBrokertest$/^amqp$' ;;
	*) echo '^TestBrokertest$' ;;
	esac
}

# failed LOG prints the deepest failing subtests of a go test log (at
# most two), or the log's last line when none failed (a build or a panic).
failed() {
	local names
	names=$(grep -E -- '--- FAIL: ' "$1" | awk '{print $3}' | awk -F/ '{print NF "\t" $0}' | sort -t$'\t' -k1,1nr -s |
		awk -F'\t' 'NR==1{m=$1} $1==m{print $2}' | head -2 | sed 's/^[^/]*\///' | paste -sd, -)
	echo "${names:-$(tail -1 "$1")}"
}

# mutant NAME MODULE FILE OLD NEW [FILE OLD NEW...]
mutant() {
	local name=$1 module=$2 verdict files=()
	shift 2
	if [[ $only != "  " && $only != *" $name "* ]]; then
		return
	fi
	while (($#)); do
		files+=("$1")
		[[ -f "$work/$1.orig" ]] || cp "$work/$1" "$work/$1.orig" 2>/dev/null
		if ! edit "$1" "$2" "$3" 2>>"$work/$name.log"; then
			verdict="not applied"
			break
		fi
		shift 3
	done
	if [[ -z ${verdict:-} ]]; then
		if ! (cd "$work/$module" && go vet . >>"$work/$name.log" 2>&1); then
			verdict=unbuilt
		elif (cd "$work/$module" && timeout 900 go test -count=1 -failfast -timeout 800s -run "$(testof "$module")" . >>"$work/$name.log" 2>&1); then
			verdict=missed
		else
			verdict="caught ($(failed "$work/$name.log"))"
			if grep -q 'panic: test timed out' "$work/$name.log"; then
				verdict="timed out" # inconclusive: the suite outran -timeout
			fi
		fi
	fi
	for f in "${files[@]}"; do
		[[ -f "$work/$f.orig" ]] && mv "$work/$f.orig" "$work/$f"
	done
	printf '%-34s %-11s %s\n' "$name" "$module" "$verdict" | tee -a "$results"
}

T=$'\t'
N=$'\n'

# --- the five of the suite's known blind spots ---

# RabbitMQ acks inside the claim's transaction, after the handler and
# before COMMIT (and so no more after the commit, but for a duplicate): a
# COMMIT that then fails loses the message.
mutant rabbitmq-ack-before-commit rabbitmq \
	rabbitmq/consumer.go '{ return c.h(ctx, tx, d) })' '{ e := c.h(ctx, tx, d); if e == nil { _ = d.Ack(false) }; return e })' \
	rabbitmq/consumer.go 'c.report(ctx, r, x, typ, n, 0, "ack", x.d.Ack(false))' 'c.report(ctx, r, x, typ, n, 0, "ack", func() error { if x.out == idempotent.Duplicate { return x.d.Ack(false) }; return nil }())'

# Redis Streams XACKs inside the claim's transaction, before COMMIT (and
# after it only a duplicate).
mutant redisstream-xack-before-commit redisstream \
	redisstream/consumer.go "${T}${T}${T}return c.handle(ctx, tx, d)${N}" "${T}${T}${T}e := c.handle(ctx, tx, d); if e == nil { r.rdb.XAck(ctx, r.stream, r.group, d.ID) }; return e${N}" \
	redisstream/consumer.go "${T}${T}${T}${T}e.Type = adapter.EventDuplicate${N}${T}${T}${T}}${N}${T}${T}${T}acks = append(acks, i)" "${T}${T}${T}${T}e.Type = adapter.EventDuplicate${N}${T}${T}${T}${T}acks = append(acks, i)${N}${T}${T}${T}}"

# NATS terminates a message whose claim another transaction holds.
mutant nats-term-on-claim-busy nats \
	nats/consumer.go 'dec := w.c.rule.Settle(d.msg, err, d.attempt)' 'dec := w.c.rule.Settle(d.msg, err, d.attempt); if errors.Is(err, idempotent.ErrClaimBusy) { dec.Action = adapter.DeadLetter }'

# Redis falls back to the entry id's time when the event-time header is
# missing on a partitioned table.
mutant redisstream-entry-time-fallback redisstream \
	redisstream/consumer.go "${T}it.msg, it.err = c.cfg.Message(d)${N}${T}if it.err == nil {${N}${T}${T}it.err = r.over(d)" "${T}it.msg, it.err = c.cfg.Message(d); if errors.Is(it.err, adapter.ErrNoEventTime) { it.msg.EventTime, it.err = d.Time(), nil }${N}${T}if it.err == nil {${N}${T}${T}it.err = r.over(d)"

# Kafka advances the offset in a second transaction, after the effect's
# committed (the claim alone in the record's transaction).
mutant kafka-offset-second-tx kafka \
	kafka/fold.go "${T}if c.fold == nil {${N}${T}${T}return nil" "${T}if true {${N}${T}${T}return nil" \
	kafka/fold.go 'return c.advanceOffset(ctx, a.Tx(), r.Topic, r.Partition, expected, next, topicID)' 'return nil' \
	kafka/consumer.go "${T}${T}if err == nil {${N}${T}${T}${T}e.Type = adapter.EventDuplicate" "${T}${T}if err == nil { _ = c.path.Tx(context.Background(), func(ctx context.Context, tx *sql.Tx) error { return c.advanceOffset(ctx, tx, r.Topic, r.Partition, expected, r.Offset+1, topicID) })${N}${T}${T}${T}e.Type = adapter.EventDuplicate"

# --- more one-line breakages ---

# Acks reported, never sent.
mutant rabbitmq-ack-not-sent rabbitmq \
	rabbitmq/consumer.go 'c.report(ctx, r, x, typ, n, 0, "ack", x.d.Ack(false))' 'c.report(ctx, r, x, typ, n, 0, "ack", nil)'
mutant redisstream-xack-not-sent redisstream \
	redisstream/consumer.go 'cmds[j] = p.XAck(ctx, r.stream, r.group, items[i].d.ID)' 'cmds[j] = p.XAck(ctx, r.stream, r.group, "0-1"+items[i].d.ID[:0])'
mutant nats-ack-not-sent nats \
	nats/consumer.go 'serr = d.m.DoubleAck(ctx)' 'serr = nil'
mutant cdkpubsub-ack-not-sent cdkpubsub \
	cdkpubsub/consumer.go "${T}${T}${T}d.m.Ack()${N}${T}${T}${T}c.events.Observe(ctx, adapter.Event{Type: typ," "${T}${T}${T}c.events.Observe(ctx, adapter.Event{Type: typ,"

# Poison acked instead of dead-lettered.
mutant rabbitmq-poison-acked rabbitmq \
	rabbitmq/consumer.go '"reject", x.d.Reject(false))' '"reject", x.d.Ack(false))'
mutant kafka-dead-letter-dropped kafka \
	kafka/consumer.go "${T}if c.cfg.deadLetter == nil {${N}${T}${T}return nil${N}${T}}${N}${T}for i, r := range poison {" "${T}if true {${N}${T}${T}return nil${N}${T}}${N}${T}for i, r := range poison {"
mutant watermill-poison-acked watermill \
	watermill/handler.go "Type: adapter.EventDeadLettered, Message: m, Err: err}, msg)${N}${T}${T}return err" "Type: adapter.EventDeadLettered, Message: m, Err: err}, msg)${N}${T}${T}return nil"

# Acked inside the transaction before COMMIT, on other transports.
mutant nats-ack-before-commit nats \
	nats/consumer.go "${T}${T}${T}return c.handle(ctx, tx, m)${N}" "${T}${T}${T}e := c.handle(ctx, tx, m); if e == nil { _ = m.DoubleAck(ctx) }; return e${N}" \
	nats/consumer.go 'serr = d.m.DoubleAck(ctx)' 'if out == idempotent.Duplicate { serr = d.m.DoubleAck(ctx) }'

# Requeues turned into acks.
mutant rabbitmq-requeue-acked rabbitmq \
	rabbitmq/consumer.go 'held, "nack", x.d.Nack(false, true))' 'held, "nack", x.d.Ack(false))'
mutant nats-requeue-acked nats \
	nats/consumer.go 'serr = d.m.NakWithDelay(dec.Delay)' 'serr = d.m.Ack()'
mutant redisstream-requeue-acked redisstream \
	redisstream/consumer.go "${T}${T}${T}r.park(d, dec.Delay)" "${T}${T}${T}acks = append(acks, i)"

# The one settle rule broken: transient database failures terminated, a
# partitioned message without an event time claimed at the clock's time.
mutant rule-claim-busy-poison rabbitmq \
	adapter/settle.go "${T}${T}errors.Is(err, idempotent.ErrAutocommit):" "${T}${T}errors.Is(err, idempotent.ErrAutocommit), errors.Is(err, idempotent.ErrClaimBusy):"
mutant rule-retries-exhausted-poison nats \
	adapter/settle.go "${T}${T}errors.Is(err, idempotent.ErrAutocommit):" "${T}${T}errors.Is(err, idempotent.ErrAutocommit), errors.Is(err, idempotent.ErrRetriesExhausted):"
mutant event-time-now-when-missing kafka \
	adapter/config.go 'if at.IsZero() && c.partition {' 'if at.IsZero() && c.partition { at = time.Now() }; if false {'

echo
echo "mutants: $(wc -l <"$results"), caught: $(grep -c ' caught' "$results"), missed: $(grep -c ' missed$' "$results") (tree at $ref)"
