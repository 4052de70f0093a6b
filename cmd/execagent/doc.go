// Command execagent is the exec agent binary that runs inside every sandbox
// (built static, CGO_ENABLED=0). It reads its configuration from
// QUARRY_AGENT_* variables, serves package execagent on QUARRY_AGENT_ADDR and
// stops, killing every process group it started, on SIGTERM or SIGINT.
//
// Variables: QUARRY_AGENT_TOKEN, QUARRY_AGENT_TOKEN_FILE, or
// QUARRY_AGENT_TOKEN_KEY (hex) with either QUARRY_AGENT_TOKEN_NONCE or
// QUARRY_AGENT_TOKEN_NONCE_FROM=ecs-task-arn (the nonce is the task's ARN,
// read from $ECS_CONTAINER_METADATA_URI_V4/task, which ECS sets), from
// which the agent derives its token (agentapi.DeriveToken) and then re-executes
// itself with the key removed and the token on a pipe (QUARRY_AGENT_TOKEN_FD,
// internal), so that /proc/<pid>/environ never shows the key (one way is
// required), QUARRY_AGENT_ADDR (default 127.0.0.1:8000; port 0 picks a free
// port), QUARRY_AGENT_ADDR_FILE (optional: the bound address is written
// there atomically once listening), QUARRY_AGENT_WORKDIR (default: the
// current directory), QUARRY_AGENT_LOG_LEVEL (debug, info, warn, error), and
// the limits of execagent.Config (QUARRY_AGENT_MAX_TIMEOUT, ...). Every
// QUARRY_AGENT_* variable is removed from the environment of the children.
//
// `execagent --version` prints the version.
//
// This command must not import gateway, warmpool or providers.
package main
