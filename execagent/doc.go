// Package execagent is the exec agent's HTTP server: it runs inside every
// sandbox and serves the wire protocol of package agentapi — one-shot exec
// (JSON or server-sent events), persistent shell sessions, background
// processes (named, and rpc processes answering one line per call), PTYs
// attached over WebSockets, file operations and tar archives, checkpoints
// and their restores, HTTP calls to the sandbox's ports and TCP port
// forwarding over WebSockets, waits for a sandbox process to end, the
// cancellation of a call in flight, the model relay's forwarder, and
// per-lease init with generation fencing. Beside /v1 it serves E2B's envd
// data plane (Connect RPCs of process.Process and filesystem.Filesystem,
// /files, /health) on the same agent processes, PTYs and files
// (docs/ARCHITECTURE.md, "E2B's envd on the agent").
//
// Lifecycle: New validates a Config and returns a Server; Serve(ctx, ln)
// serves HTTP on a listener until Close. Close kills every process group the
// server started (exec runs, sessions, background processes, PTYs), stops
// the zombie reaper and waits for every goroutine the server owns. A caller
// still waiting on a command that Close killed (exec, session run, rpc call)
// gets 410 gone, not that command's exit status: Close cancels the server's
// context before it kills, and handlers check it after their wait.
//
// Orphans (orphan.go): the server reports through Orphaned when nothing owns
// it any more (its Config.OwnerDir is gone, or it holds no lease and got no
// authenticated call for Config.IdleExit); cmd/execagent then closes it and
// exits. It never decides that for a leased agent whose gateway is silent.
//
// Requests: JSON bodies are decoded strictly (an unknown field is 400
// naming it); a command string too long for one argument of a new process
// runs from a private script file in StateDir, removed when it ends.
//
// Child bookkeeping (children.go): every child is started in its own process
// group while holding the child table's lock and registered before the lock
// is released. The reaper (the agent is a child subreaper, or PID 1 in a
// container) reaps only zombies the table does not track, so it never steals
// the exit status that exec.Cmd.Wait reports for tracked children.
//
// Kill-all (killall.go) kills every process of the sandbox but the agent
// in rounds, holding the child table's lock in each so that nothing it
// kills is reaped before it is counted, and answers once all of it has
// been reaped.
//
// Archive uploads (upload.go) extract into a staging directory in their
// target and merge into it with journaled renames once every entry was
// accepted: a refused archive leaves its target as it was. Restores
// (restore.go) stage the same way and swap whole roots.
//
// Files: server.go the Server (New, Serve, Close), its routes,
// authentication, fencing, health and init; config.go Config; errors.go the
// agent's sentinel errors and their ErrorBody answers; exec.go one-shot
// exec and the shell; session.go shell sessions; process.go background
// processes; rpc.go named and rpc processes; pty.go PTYs; children.go the
// child table and the reaper; killall.go kill-all; orphan.go the orphan
// check; limits.go how the agent outlives its sandbox's pids and memory
// limits; cgroup.go the OOM kill count; files.go file operations;
// archive.go archive downloads and uploads; upload.go staged extraction and
// its merge; extract_fast.go the extraction's fast path; storage.go a full
// disk's answer and upload bodies; checkpoint.go checkpoints; restore.go
// restores; ports.go the proxy to the sandbox's ports; portforward.go TCP
// port forwarding; pidwait.go waits for a sandbox process; calls.go call
// cancellation; relay.go the model relay's forwarder; encoding.go stdin and
// output encodings; ring.go the output ring buffer; sse.go the server-sent
// events writer. E2B's envd: envd.go its routes, Connect's JSON protocol and
// the rendering of errors; envd_wire.go the messages; envd_process.go the
// process service; envd_fs.go the filesystem service; envd_watch.go its
// inotify watchers; envd_files.go /files; envd_meta.go file metadata.
//
// Nothing in this package reads environment variables: cmd/execagent fills a
// Config. Children never see QUARRY_AGENT_* variables (see Config.Env).
//
// This package must not import gateway, warmpool or providers; it depends on
// execagent/agentapi and internal/defaults only.
package execagent
