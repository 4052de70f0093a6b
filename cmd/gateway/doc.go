// Command gateway is Quarry's gateway: it reads its configuration from
// QUARRY_* environment variables (docs/CONFIG.md), opens the lease store,
// builds the providers the pools use, listens on QUARRY_ADDR and (for
// providers that mount it into sandboxes, relaysocket.go) on the model
// relay's socket, then starts the warm-pool manager and serves the REST API
// (package gateway) over HTTP, or HTTPS when QUARRY_TLS_CERT_FILE and
// QUARRY_TLS_KEY_FILE are set.
//
// The lease store is the embedded one (QUARRY_STORE=embedded, one process)
// or DynamoDB (QUARRY_STORE=dynamodb, dynamodb.go: any number of replicas
// on the same tables), reached with the AWS SDK's standard configuration
// (config.LoadDefaultConfig); every DynamoDB request is counted in
// quarry_dynamodb_requests_total by operation and by the manager call it
// serves. Replicas hold no state of their own: QUARRY_REPLICA_ID names
// each one as the holder of the background-work locks.
//
// Without QUARRY_API_KEYS it generates a key once, saves it in
// $QUARRY_DATA_DIR/api-key (mode 0600) and reuses it on every start. On
// SIGINT or SIGTERM it stops accepting, finishes requests in flight (at most
// QUARRY_SHUTDOWN_TIMEOUT) and closes the manager (which releases its locks,
// for the other replicas if there are any) and the store; sandboxes keep
// running, and the next
// start serves their leases again.
//
// Inside AWS Lambda (AWS_LAMBDA_RUNTIME_API is set; lambda.go,
// docs/DEPLOY.md) the same gateway app answers API Gateway HTTP API and
// Function URL events through an adapter to fasthttp, with buffered
// answers, and a scheduled EventBridge event runs one lock-gated pass of
// the warm pool's background work (warmpool.Manager.RunOnce); no loop runs
// between invocations. QUARRY_POOLS carries the pools document inline, and
// QUARRY_SECRET_ARNS names Secrets Manager secrets whose values become
// variables at start-up (secrets.go), so that no secret value is in the
// function's configuration.
//
// It is where the concrete providers, stores and brokers are wired to the
// gateway (cmd/ builds the map from name to constructor): it may import any
// package of the module, and no package imports it.
package main
