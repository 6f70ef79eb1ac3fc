module github.com/txclaim/idempotent/tests

go 1.26.0

require (
	github.com/DATA-DOG/go-sqlmock v1.5.2
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/go-sql-driver/mysql v1.10.1
	github.com/jackc/pgx/v5 v5.13.0
	github.com/lib/pq v1.12.3
	github.com/nats-io/nats.go v1.55.0
	github.com/ory/dockertest/v3 v3.12.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/txclaim/idempotent v0.0.0
	github.com/txclaim/idempotent/idemhttp v0.0.0
	github.com/txclaim/idempotent/idempgx v0.0.0
	github.com/txclaim/idempotent/kafka v0.0.0
	github.com/txclaim/idempotent/mysql v0.0.0
	github.com/txclaim/idempotent/nats v0.0.0
	github.com/txclaim/idempotent/otelmetrics v0.0.0
	github.com/txclaim/idempotent/oteltrace v0.0.0
	github.com/txclaim/idempotent/rabbitmq v0.0.0
	github.com/txclaim/idempotent/redisstream v0.0.0
	github.com/txclaim/idempotent/sqlite v0.0.0
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/sdk/metric v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
	gocloud.dev v0.47.0
	golang.org/x/mod v0.42.0
)

require (
	github.com/googleapis/gax-go/v2 v2.27.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/xerrors v0.0.0-20240903120638-7835f813f4da // indirect
	google.golang.org/api v0.304.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261012220534-4341edf3f941 // indirect
	google.golang.org/grpc v1.84.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

require (
	dario.cat/mergo v1.0.0 // indirect
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/Azure/go-ansiterm v0.0.0-20230124172434-306776ec8161 // indirect
	github.com/Microsoft/go-winio v0.6.2 // indirect
	github.com/Nvveen/Gotty v0.0.0-20120604004816-cd527374f1e5 // indirect
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/containerd/continuity v0.4.5 // indirect
	github.com/docker/cli v27.4.1+incompatible // indirect
	github.com/docker/docker v27.1.1+incompatible // indirect
	github.com/docker/go-connections v0.5.0 // indirect
	github.com/docker/go-units v0.5.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/go-viper/mapstructure/v2 v2.1.0 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/google/shlex v0.0.0-20191202100458-e7afc7fbc510 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/moby/docker-image-spec v1.3.1 // indirect
	github.com/moby/sys/user v0.3.0 // indirect
	github.com/moby/term v0.5.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.0 // indirect
	github.com/opencontainers/runc v1.2.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	github.com/txclaim/idempotent/cdkpubsub v0.0.0
	github.com/txclaim/idempotent/watermill v0.0.0
	github.com/xeipuuv/gojsonpointer v0.0.0-20190905194746-02993c407bfb // indirect
	github.com/xeipuuv/gojsonreference v0.0.0-20180127040603-bd5ef7bd5415 // indirect
	github.com/xeipuuv/gojsonschema v1.2.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

replace github.com/txclaim/idempotent => ../

replace (
	github.com/txclaim/idempotent/idemhttp => ../idemhttp
	github.com/txclaim/idempotent/idempgx => ../idempgx
	github.com/txclaim/idempotent/idemsqlx => ../idemsqlx
	github.com/txclaim/idempotent/kafka => ../kafka
	github.com/txclaim/idempotent/mysql => ../mysql
	github.com/txclaim/idempotent/nats => ../nats
	github.com/txclaim/idempotent/otelmetrics => ../otelmetrics
	github.com/txclaim/idempotent/oteltrace => ../oteltrace
	github.com/txclaim/idempotent/rabbitmq => ../rabbitmq
	github.com/txclaim/idempotent/redisstream => ../redisstream
	github.com/txclaim/idempotent/sqlite => ../sqlite
)

replace github.com/txclaim/idempotent/cdkpubsub => ../cdkpubsub

replace github.com/txclaim/idempotent/watermill => ../watermill
