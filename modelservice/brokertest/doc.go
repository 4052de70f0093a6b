// Package brokertest is the conformance suite of the model relay's broker
// contract (modelservice/broker.go). Every broker runs it from its own
// tests:
//
//	func TestBroker_Conformance(t *testing.T) {
//		brokertest.Run(t, func(t *testing.T) modelservice.Broker { ... }, brokertest.Options{})
//	}
//
// A broker is done when the suite passes: byte-for-byte bodies (large ones
// too), claims by owner, pool and labels, visibility timeouts, deadlines,
// one answer per request, cancels, transcripts, and, with
// Options.NewReplica, a request submitted on one replica and answered on
// another.
//
// It imports only modelservice and test libraries; it must not import a
// concrete broker or the gateway.
package brokertest
