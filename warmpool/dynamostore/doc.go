// Package dynamostore is the lease store on DynamoDB: warmpool.Store for
// many gateway replicas sharing two tables (tasks and leases). It passes
// warmpool/storetest, like the embedded store.
//
// Every ownership decision is a conditional write: claiming a ready task
// (its version and state must still match), reserving capacity (the pool's
// sharded counters must stay within max_total, and for an on-demand pool
// its record must be active and its class's counters within the class's
// total), renewing (only the holder, only before expiry), ending and
// expiring a lease, ending an on-demand pool (only while none of its tasks
// is counted). Where two items change together (task and lease, task and
// capacity counter, pool record and counters) the write is one
// TransactWriteItems. Lease validity is decided by conditions on the
// stored expiry; DynamoDB's TTL attribute only collects garbage, and reads
// treat an item whose TTL has passed as gone.
//
// Hot keys are sharded: ready tasks, tasks by pool, capacity counters,
// leases by owner, by expiry and by end time are spread over Config.Shards
// partition keys each. docs/ARCHITECTURE.md ("DynamoDB table design")
// describes the tables, the access patterns and the calls each path makes.
//
// Files: store.go the Store (New, Close) and the reads every call shares;
// api.go the API interface and the per-operation call counts; config.go
// Config (defaults, Validate); schema.go the tables (CreateTables,
// DeleteTables, the emulator's init script); keys.go the keys and their
// shards; item.go the records as items; expr.go the expression builder;
// errors.go the SDK's errors as the contract's sentinels; tasks.go the task
// records and the sharded counters (warmpool.TaskStore); claim.go Claim;
// leases.go the other lease calls (warmpool.LeaseStore); pools.go the
// on-demand pools' records (warmpool.PoolStore); lock.go the named locks
// (warmpool.Locker); rand.go the randomness of shard picks, ready-index
// sort keys and backoff.
//
// The package talks to DynamoDB only through the API interface (a subset
// of *dynamodb.Client), never reads the environment (cmd/ builds the SDK
// client, which reads AWS_REGION and AWS_ENDPOINT_URL by itself), and must
// not import the gateway, the providers or another store.
package dynamostore
