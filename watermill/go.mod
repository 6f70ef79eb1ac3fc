module github.com/txclaim/idempotent/watermill

go 1.26.8

require github.com/txclaim/idempotent v0.0.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.1 // indirect
	github.com/ThreeDotsLabs/watermill-amqp/v3 v3.0.2 // indirect
	github.com/ThreeDotsLabs/watermill-sql/v4 v4.1.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/lib/pq v1.12.3 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0 // indirect
)

replace github.com/txclaim/idempotent => ../
