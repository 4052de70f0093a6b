// Package ddbsim is a simulator of DynamoDB — not DynamoDB — for benchmarks
// only: the fleet simulation of issue 13 runs real gateway replicas on the
// real DynamoDB lease store and relay broker, and the emulator (moto,
// serialized) answers about 150 requests/s. Every figure it reports is a
// simulated one.
//
// A Server speaks DynamoDB's JSON protocol (POST /, X-Amz-Target
// DynamoDB_20120810.<Operation>) on a loopback address, in memory, so the
// AWS SDK and the code on it run unchanged (AWS_ENDPOINT_URL, or Client).
// It serves CreateTable, DescribeTable, DeleteTable, ListTables,
// UpdateTimeToLive, DescribeTimeToLive, GetItem, PutItem, UpdateItem,
// DeleteItem, Query (tables and global indexes), Scan (with Segment and
// TotalSegments), BatchGetItem, BatchWriteItem, TransactWriteItems and
// TransactGetItems, with the whole expression grammar: conditions, filters,
// key conditions and projections with names and values (comparisons,
// AND/OR/NOT, parentheses, BETWEEN, IN, attribute_exists,
// attribute_not_exists, attribute_type, begins_with, contains, size), and
// updates (SET with + and -, if_not_exists, list_append; REMOVE; ADD;
// DELETE), with ReturnValues, ReturnValuesOnConditionCheckFailure and
// ReturnConsumedCapacity. It refuses what it does not simulate with a
// ValidationException that says so, in DynamoDB's error shape; an unknown
// operation is an UnknownOperationException, an unknown parameter a
// ValidationException (never ignored).
//
// What it simulates of DynamoDB's published behaviour:
//   - atomic requests: one mutex around each operation's in-memory work
//     (decoding and encoding run outside it); a transaction is all or
//     nothing across tables, with per-action CancellationReasons (None,
//     ConditionalCheckFailed with the item for ALL_OLD, ValidationError,
//     ThrottlingError) and ClientRequestToken idempotency for 10 minutes;
//   - limits: items 400 KB, transactions 100 actions and 4 MB,
//     BatchGetItem 100 keys, BatchWriteItem 25 requests, key sizes, 38-digit
//     numbers, 1 MB pages, expressions 4 KB, IN 100 operands, reserved words;
//   - global secondary indexes that lag (Config.IndexLag, 10 ms by default)
//     and are sparse, with KEYS_ONLY, INCLUDE and ALL projections;
//     strongly consistent reads of tables are current;
//   - capacity in AWS's units (4 KB reads, halved when eventually
//     consistent; 1 KB writes; twice in transactions; index writes per
//     index), drawn from a token bucket per partition key value of every
//     table and index (1,000 WCU/s, 3,000 RCU/s: a hot key is throttled with
//     ProvisionedThroughputExceededException and a KeyRangeThroughputExceeded
//     reason) and per table (40,000 units/s, or the table's provisioned or
//     OnDemandThroughput figures: ThrottlingException);
//   - counts: requests, errors and throttles by operation, and the units
//     consumed by table (Stats, GET /ddbsim/stats).
//
// Known gaps (what it does not simulate, or simulates otherwise):
//   - not served: PartiQL, streams, local secondary indexes, UpdateTable,
//     backups, global tables, tags beyond CreateTable's, the legacy
//     parameters (Expected, AttributeUpdates, KeyConditions, QueryFilter,
//     ScanFilter, AttributesToGet, ConditionalOperator);
//   - TTL is recorded (UpdateTimeToLive, DescribeTimeToLive) but nothing is
//     ever deleted by it; AWS deletes expired items within days;
//   - transactions never conflict (TransactionConflict,
//     TransactionInProgressException): each runs alone under the mutex;
//   - a partition is one partition key value: DynamoDB's split for heat
//     (one key's sort-key ranges on several partitions) is not simulated,
//     nor a new on-demand table's ramp from 4,000 writes/s (tables act as
//     warm); Scan draws on the table's bucket only;
//   - ItemCount and sizes are exact at once (AWS updates them every few
//     hours); a table is ACTIVE at once unless Config.TableCreateDelay;
//   - a cancelled transaction consumes no capacity; a ConditionCheck costs
//     a transactional read of its item;
//   - size() of a string counts characters.
//
// Where the simulator and moto disagree, AWS's documentation decides:
// indexes lag (moto's are current), transactions are atomic under
// concurrency (moto's are not, without the serializing wrapper), numbers
// are exact decimals of 38 digits, and unused or undefined placeholders,
// reserved words and overlapping paths are refused as AWS refuses them.
//
// It imports no other Quarry package but internal/defaults and
// internal/clock.
package ddbsim
