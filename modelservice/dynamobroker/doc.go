// Package dynamobroker is the model relay's DynamoDB broker, for gateway
// replicas: an agent's call and the trainer's answer may reach different
// replicas. Every request is one meta item in one table (pk "R#<id>", sk
// "M"), with its body inline up to 128 KiB and otherwise split into chunk
// items of 300 KiB (DynamoDB items are limited to 400 KB). A sparse global
// index ("queue": owner, visible-at) holds the pending and claimed
// requests; claims are conditional updates of the queue key, so a request
// goes to one claimer per visibility period. Another index ("by-lease")
// orders each lease's exchanges for its transcript. Items expire through
// DynamoDB's TTL after the retention.
//
// Waiting costs polls, bounded per replica: a waiting claim queries its
// owner's queue with backoff (Config.ClaimPollMin doubling to
// ClaimPollMax; a call submitted on the same replica wakes it at once),
// and a replica whose agents wait reads its inbox of answer notices every
// Config.AwaitPoll (one Query, however many calls wait). An answer given on
// the same replica wakes its call at once.
//
// CreateTables and DeleteTables manage the table (the quarry CLI's
// `tables` command calls them). It implements the modelservice.Broker
// contract and passes modelservice/brokertest. It imports modelservice and
// the AWS SDK only; it must not import the gateway, the warm pool or
// another broker.
package dynamobroker
