module github.com/txclaim/idempotent/rabbitmq

go 1.22

require (
	github.com/lib/pq v1.12.3
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/txclaim/idempotent v0.0.0
)

require github.com/DATA-DOG/go-sqlmock v1.5.2

replace github.com/txclaim/idempotent => ../
