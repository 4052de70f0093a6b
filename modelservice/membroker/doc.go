// Package membroker is the model relay's in-memory broker, the single-node
// default: requests wait in a queue in the gateway process, Claim long-polls
// on a channel that Submit closes, Await on a channel per request. Nothing
// survives a restart, and replicas do not share it (use dynamobroker).
// Bodies held are bounded (Config.MaxBytes); exchanges are purged after
// their retention (Purge, called by the Service's janitor).
//
// It implements the modelservice.Broker contract and passes its conformance
// suite (modelservice/brokertest). It imports only modelservice and
// internal/clock; it must not import the gateway, the warm pool or another
// broker.
package membroker
