// Package process is the development provider: each sandbox task is the exec
// agent running as a child process of the gateway, in its own directory
// (Dir/<task>/work, also its HOME) and its own session and process group,
// listening on 127.0.0.1 with its own token. It needs nothing installed.
//
// It isolates nothing: commands run as the gateway's user on the host, see
// its files and network, and can read the agent's token from /proc. CPU and
// memory from the spec are not enforced. Use it for development and tests.
//
// State lives on disk, never only in memory: Dir/<task>/task.json (mode
// 0600) records the agent's pid, its start time (to detect pid reuse), its
// URL, token and labels, so a new Provider on the same Dir — a restarted
// gateway — finds, describes and stops the tasks of an earlier one. Agents
// are started with no pipe to the gateway (stdout and stderr go to
// Dir/<task>/agent.log), so they survive a gateway restart. They do not
// survive their directory: Dir/<task> is their QUARRY_AGENT_OWNER_DIR, and an
// agent that finds it gone exits and kills its sandbox's processes, so
// removing a gateway's Dir (a test's temp dir) leaves no agent behind.
//
// This package must not import gateway or warmpool.
package process
