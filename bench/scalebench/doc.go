// Package scalebench is the fleet simulation's harness (issue 13, `make
// bench-scale`): for each size N it builds a fresh simulated world — the
// DynamoDB simulator (bench/ddbsim's command), the ECS simulator
// (bench/ecssim, in this process) and its simulated agents (bench/agentsim's
// command, several processes) — starts R real gateway binaries on it
// (QUARRY_PROVIDER=ecs with AWS_ENDPOINT_URL_ECS, QUARRY_STORE=dynamodb and
// QUARRY_RELAY_BROKER=dynamodb with AWS_ENDPOINT_URL_DYNAMODB) with one pool
// of min_warm N, and measures what issue 13's goal table asks: the fill
// time against the AWS floor, N concurrent acquires (create → alive), the
// store and ECS calls in steady state with N leased and their DynamoDB
// on-demand cost, acquires with N leased, each replica's RSS and the
// reconciler's pass time.
//
// With Config.Images (RunImages, `-images M`) it runs the images scenario
// of issue 22 instead (images.go, imageset.go, imagereport.go): a
// SWE-style batch of N sandboxes over M task images of assumed sizes,
// pulled at an assumed Fargate rate, on a pool class; without and then
// with a prefetch of the batch, each in a fresh world. It reports the time
// to first command, the task definitions registered per image, the
// throttles, the batch's time against the floor of AWS's
// RegisterTaskDefinition and launch rates, the sandboxes lost, the store
// and ECS calls, the pools' end after the batch and the gateways' RSS.
//
// Every figure that depends on a simulator is labelled simulated; the
// store is always the DynamoDB simulator (the AWS emulator answers ~150
// requests a second, far too few). Times of the simulated world are wall
// times divided by the time scale (docs/ARCHITECTURE.md, "One time scale");
// request latencies are reported as measured on this machine.
//
// It imports the table schemas (warmpool/dynamostore,
// modelservice/dynamobroker), the REST wire types (api) and the
// simulators; it runs the gateway as a binary and imports none of the
// server packages.
package scalebench
