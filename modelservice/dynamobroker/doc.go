// Package dynamobroker is the model relay's DynamoDB broker, for gateway
// replicas: an agent's call and the trainer's answer may reach different
// replicas. Every request is one small meta item in one table (pk
// "R#<id>", sk "M"); its body is in items of its own (300 KiB each), and an
// answer is inline up to 128 KiB, otherwise in items too (DynamoDB items
// are limited to 400 KB). A sparse global index ("queue-by-shard": owner
// and shard, visible-at) holds the pending and claimed requests, spread
// over Config.QueueShards partition keys per owner so that no trainer key
// makes a hot partition, and projects only what a claim filters by; a claim
// merges the shards oldest first and takes each request with a conditional
// update of its queue key, so a request goes to one claimer per
// visibility period, then reads the bodies it won with BatchGetItem. The
// claims of one owner on one replica take turns (queue.go's claimLane).
// Another index ("by-lease") orders each lease's exchanges for its
// transcript. Items expire through DynamoDB's TTL after the retention.
// docs/ARCHITECTURE.md ("The relay's table design") has the arithmetic.
//
// Waiting costs polls, bounded per replica: a waiting claim queries its
// owner's shards with backoff (Config.ClaimPollMin doubling to
// ClaimPollMax; a call submitted on the same replica wakes it at once).
// An answer given on another replica is queued as a notice, and one
// flusher per replica writes the notices for one waiting replica as one
// item in its inbox, which that replica reads every Config.AwaitPoll while
// calls wait (one Query, however many calls wait). A waiting call also
// reads its request's state (a projection of the small meta item) after
// Config.Recheck, doubling to RecheckMax, in case a notice was lost. An
// answer given on the same replica wakes its call at once.
//
// CreateTables and DeleteTables manage the table (the quarry CLI's
// `tables` command calls them). It implements the modelservice.Broker
// contract and passes modelservice/brokertest. It imports modelservice, the
// AWS SDK and internal helpers only; it must not import the gateway, the
// warm pool or another broker.
package dynamobroker
