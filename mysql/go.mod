module github.com/txclaim/idempotent/mysql

go 1.24.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/txclaim/idempotent v0.0.0
)

require filippo.io/edwards25519 v1.2.0 // indirect

replace github.com/txclaim/idempotent => ../
