module github.com/txclaim/idempotent/idemhttp

go 1.26.0

require (
	github.com/txclaim/idempotent v0.0.0
	github.com/txclaim/idempotent/mysql v0.0.0
	github.com/txclaim/idempotent/sqlite v0.0.0
)

replace (
	github.com/txclaim/idempotent => ../
	github.com/txclaim/idempotent/mysql => ../mysql
	github.com/txclaim/idempotent/sqlite => ../sqlite
)
