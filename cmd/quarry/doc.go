// Command quarry is the command line of Quarry for people debugging
// sandboxes: it leases, lists, inspects and releases sandboxes, runs commands
// in them (streamed, or in an interactive shell), copies files in and out,
// restores and forks them from checkpoints, prints preview URLs of their
// ports, and prefetches, lists and builds images of on-demand pools, through
// the gateway's REST API (package client). For local use and tests it also
// creates and deletes the DynamoDB tables of the lease store, the model
// relay's broker and the checkpoint store, and prints new API keys (of
// E2B's shape with --e2b, for E2B's SDK).
//
//	quarry [--url URL] [--api-key KEY] sandbox create|ls|exec|shell|cp|rm|… ARGS
//	quarry checkpoint create|ls|rm ARGS
//	quarry image prefetch|ls|build ARGS
//	quarry pools
//	quarry tables create|delete [--tasks-table T] [--leases-table T] [--shards N]
//	quarry key new [--e2b]
//
// Every command is a row of one table, groups (main.go), from which quarry -h,
// each group's help, the dispatch and each command's usage are made.
//
// QUARRY_URL (default http://127.0.0.1:8080) and QUARRY_API_KEY are read
// here, in main's run, and nowhere else; --url and --api-key override them.
// `quarry tables` reads QUARRY_DYNAMODB_TASKS_TABLE, _LEASES_TABLE, _SHARDS
// and _REGION, QUARRY_RELAY_DYNAMODB_TABLE and QUARRY_CHECKPOINT_TABLE as
// the gateway does (through the cli's getenv, set by run),
// and the AWS SDK reads its standard settings (AWS_REGION,
// AWS_ENDPOINT_URL, credentials).
// Exit status: the remote command's for exec (and shell's exit), otherwise 0,
// or 1 with a one-line error on stderr. exec writes the command's stdout
// and stderr byte for byte (they travel as base64) and streams all of it;
// with --max-output SIZE, output over SIZE per stream is discarded, said on
// stderr, and exec exits with the command's status if that is not 0, else
// 3 (exitOutputCut).
//
// It must not import the server packages (gateway, warmpool, providers,
// execagent); it talks to the gateway through package client only. The
// exceptions are the stores whose tables `quarry tables` manages
// (warmpool/dynamostore, modelservice/dynamobroker, checkpoints/s3store):
// their table definitions live there and nowhere else.
package main
