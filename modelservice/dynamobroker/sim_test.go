package dynamobroker_test

import (
	"context"
	"testing"

	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ddbsim/ddbsimtest"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/brokertest"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
)

// TestBroker_Conformance_Simulator runs the broker suite against
// bench/ddbsim, a simulator of DynamoDB (not DynamoDB), started
// in-process: it needs nothing but Go, so it runs under plain go test.
// Every replica has its own SDK client. The queue index is current at once
// (IndexLag -1, as on the emulator): the suite claims without waiting
// right after a submit, which an index that lags (AWS's, and the
// simulator's default) does not show yet.
func TestBroker_Conformance_Simulator(t *testing.T) {
	url, _ := ddbsimtest.Start(t, ddbsim.Config{IndexLag: -1})
	client := ddbsim.Client(url, 3)
	open := func(t *testing.T, table string) modelservice.Broker {
		b := dynamobroker.New(dynamobroker.Config{Table: table}, ddbsim.Client(url, 3), nil)
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		return b
	}
	tables := map[modelservice.Broker]string{}
	brokertest.Run(t, func(t *testing.T) modelservice.Broker {
		table := freshTable(t, client)
		b := open(t, table)
		tables[b] = table
		return b
	}, brokertest.Options{
		NewReplica: func(t *testing.T, b modelservice.Broker) modelservice.Broker { return open(t, tables[b]) },
	})
}
