// Package rockcompat serves the routes of ROCK's admin API that ROCK's
// Python SDK (rl-rock) uses — /apis/envs/sandbox/v1/{start,start_async,
// get_status,is_alive,execute,create_session,run_in_session,close_session,
// read_file,write_file,upload,stop,delete} in ROCK's response envelope — and
// ROCK's GEM env routes (gem.go, /apis/v1/envs/gem/…, over package envs), as
// a set of fiber handlers over Quarry's own services: leases from the warm
// pool (Leases) and the sandbox's exec agent (agentapi). docs/ROCK.md says
// how a ROCK user switches, which routes are not served and where Quarry
// differs.
//
// The package keeps nothing in memory that matters, so any gateway replica
// serves any call: a ROCK sandbox id is a lease id (or the caller's chosen
// id, kept as the lease's idempotency key and label); a ROCK session name is
// mapped to its agent session by a small file inside the sandbox; the real
// exit code of a nohup command is kept in a file inside the sandbox until
// the SDK reads the command's output (nohup.go; Config.NohupExit decides
// whether that read answers it), and the SDK's "kill -0 PID" check of such
// a command is held at the agent until the command ends (Config.PollHold).
// docs/ROCK.md explains each mapping.
//
// The gateway authenticates callers and registers Routes (gateway/rock.go).
// This package must not import gateway, a provider, a store or cmd/.
package rockcompat
