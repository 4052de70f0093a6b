// Package boltstore is the embedded lease store: warmpool.Store on one bbolt
// file (in QUARRY_DATA_DIR), durable (fsync on every commit) and for a single
// gateway node. Every operation is one serializable bbolt transaction, so
// each conditional write of the contract is checked and applied atomically.
//
// Records are JSON values in the "tasks" and "leases" buckets. Index buckets
// keep the hot paths off full scans: ready tasks by pool and age (Claim),
// tasks by pool (ReserveTasks, ListTasks), leases by idempotency key, by
// owner and creation time (the gateway's lists), by expiry of active leases
// (the reaper) and by end time (PurgeLeases). A claim writes six buckets;
// listing every lease without an owner filter is a full scan (operators
// only).
//
// It passes warmpool/storetest. It must not import the gateway, the
// providers or any other store.
package boltstore
