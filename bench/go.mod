module github.com/omnibus-go/omnibus/bench

go 1.26.0

replace github.com/omnibus-go/omnibus => ../

require (
	github.com/Rican7/retry v0.3.1 // indirect
	github.com/ThreeDotsLabs/watermill v1.5.1 // indirect
	github.com/ThreeDotsLabs/watermill-kafka/v3 v3.0.6 // indirect
	github.com/ThreeDotsLabs/watermill-redisstream v1.4.5 // indirect
	github.com/ThreeDotsLabs/watermill-sql/v4 v4.1.2 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/omnibus-go/omnibus v0.0.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	github.com/vmihailenco/msgpack v4.0.4+incompatible // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	google.golang.org/appengine v1.6.8 // indirect
	google.golang.org/protobuf v1.36.8 // indirect
)
