// Command quarry is the command line of Quarry for people debugging
// sandboxes: it leases, lists, inspects and releases sandboxes, runs commands
// in them (streamed, or in an interactive session) and copies files in and
// out, through the gateway's REST API (package client).
//
//	quarry [--url URL] [--api-key KEY] sandbox create|ls|get|heartbeat|exec|shell|cp|rm …
//	quarry pools
//
// QUARRY_URL (default http://127.0.0.1:8080) and QUARRY_API_KEY are read
// here, in main's run, and nowhere else; --url and --api-key override them.
// Exit status: the remote command's for exec (and shell's exit), otherwise 0,
// or 1 with a one-line error on stderr.
//
// It must not import the server packages (gateway, warmpool, providers,
// execagent); it talks to the gateway through package client only.
package main
