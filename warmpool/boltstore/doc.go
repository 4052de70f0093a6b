// Package boltstore is the embedded lease store: warmpool.Store on one bbolt
// file (cmd/gateway puts it in QUARRY_DATA_DIR), durable (fsync on every
// commit unless Options.NoSync) and for a single gateway node. Every read is
// one bbolt read transaction; every write runs whole inside one serializable
// read-write transaction, which the writer goroutine may share with the
// other writes waiting at the same time (group commit), so each conditional
// write of the contract is checked and applied atomically. PurgeLeases
// deletes in several transactions of a bounded size.
//
// Records are JSON values in the "tasks", "leases", "pools" and "locks"
// buckets; a lease's env is kept apart in "leases_env". Index buckets keep
// the hot paths off full scans: ready tasks by pool and age (Claim), tasks
// by pool (ListTasks, ListTasksPage), leases by idempotency key, by owner
// and creation time (the gateway's lists), by expiry of active leases (the
// reaper) and by end time (PurgeLeases), pools by class (ListPoolsPage).
// Counter buckets hold each pool's tasks by state (CountTasks, and the
// max_total check of ReserveTasks) and each class's tasks
// (ReserveClassTasks). A claim writes six buckets, eight with an
// idempotency key and an env; listing every lease without an owner filter
// is a full scan (operators only).
//
// Files: store.go the Store (Open, Close), its transactions and the writer
// that group-commits writes; errors.go which write errors are the
// contract's refusals, and bbolt's errors as its sentinels; keys.go the
// bucket names and the key encodings; tasks.go the task records and their
// counters (warmpool.TaskStore); claim.go Claim; leases.go the other lease
// calls (warmpool.LeaseStore); pools.go the on-demand pools' records and
// class counters (warmpool.PoolStore); lock.go the named locks
// (warmpool.Locker).
//
// It passes warmpool/storetest. It must not import the gateway, the
// providers or any other store.
package boltstore
