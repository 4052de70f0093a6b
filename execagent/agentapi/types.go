package agentapi

import (
	"bufio"
	"encoding/json"
	"time"

	"github.com/quarryhq/quarry/api"
)

// Version is the wire-protocol version of the exec agent. It is reported by
// /healthz; the gateway refuses agents with a different major version.
const Version = "1.2.0"

// HTTP headers of the agent protocol.
const (
	// HeaderGeneration carries the lease generation of the caller. The agent
	// refuses (409, code "stale_generation") any request whose generation is
	// lower than the one set by the latest /v1/init. A request without the
	// header counts as generation 0.
	HeaderGeneration = "X-Quarry-Generation"
	// HeaderCallID names a request so that the caller can cancel it while it
	// runs (DELETE RouteCall): 1 to 64 letters, digits, '-' or '_'. The
	// gateway sets it on command calls and cancels them when its own client
	// goes away, so that the command stops (and its session is free again).
	HeaderCallID = "X-Quarry-Call-Id"
	// HeaderFormat, HeaderFiles, HeaderSkipped and HeaderBytes describe a
	// checkpoint archive (GET RouteCheckpoint); the agent sends them with
	// the status, before the body, from the walk it made before streaming:
	// the archive's format (FormatTarGzip), its entries, the special files
	// (devices, sockets, fifos) it left out, and the bytes of its regular
	// files (uncompressed).
	HeaderFormat  = "X-Quarry-Format"
	HeaderFiles   = "X-Quarry-Files"
	HeaderSkipped = "X-Quarry-Skipped"
	HeaderBytes   = "X-Quarry-Bytes"
	// HeaderRoots, with the same answer, lists the archive's roots as a
	// JSON array of absolute paths (the PAXRoots record's value), so that
	// the caller knows which absolute paths it holds (a relative path or
	// none, the work dir, resolved) before it reads the body.
	HeaderRoots = "X-Quarry-Roots"
	// TrailerVouchedSHA256 is the trailer of a restore's body (PUT
	// /v1/checkpoint) whose sender checked the bytes it sent: its value,
	// sent after the last byte, is the SHA-256 (hex) they hashed to at the
	// sender, or empty when they did not. A request that announces it
	// (Trailer: X-Quarry-Vouched-Sha256) is not hashed again by the agent,
	// which commits only when the trailer equals the sha256 parameter. The
	// gateway vouches for what it read from its checkpoint store, which
	// hashes every byte it returns: the bytes are verified once, not twice.
	TrailerVouchedSHA256 = "X-Quarry-Vouched-Sha256"
)

// The formats of a checkpoint archive: a tar stream whose first entry is a
// PAX global header with the record PAXRoots, each root's entries named by
// their absolute path without the leading "/", the root's own entry first;
// FormatTar as it is (CompressionNone), FormatTarGzip gzip compressed (one
// gzip member or several). A restore takes either, told apart by gzip's
// magic bytes.
const (
	FormatTar     = "tar"
	FormatTarGzip = "tar+gzip"
)

// ContentType returns the media type of a checkpoint archive of format.
func ContentType(format string) string {
	if format == FormatTar {
		return "application/x-tar"
	}
	return "application/gzip"
}

// FormatOf returns the format of a checkpoint archive taken at the
// compression level named (CompressionNone: FormatTar; every other level:
// FormatTarGzip).
func FormatOf(compression string) string {
	if compression == CompressionNone {
		return FormatTar
	}
	return FormatTarGzip
}

// IsGzip reports whether an archive that r reads starts with gzip's magic
// bytes (a tar+gzip checkpoint or upload); else it is a plain tar. It only
// peeks.
func IsGzip(r *bufio.Reader) bool {
	magic, _ := r.Peek(2)
	return len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b
}

// PAXRoots is the PAX record of a checkpoint archive's global header that
// lists its roots: a JSON array of absolute, clean paths, none inside
// another.
const PAXRoots = "QUARRY.roots"

// PAXWorkdir is the PAX record of a checkpoint archive's global header
// that names the work dir of the agent that took it. A restore by an
// agent with another work dir puts the roots at or below that work dir
// below its own (the process provider gives each sandbox its own work dir;
// Docker's and ECS's are the same in every sandbox of an image), so a
// checkpoint restored into another sandbox never writes into the
// sandbox it was taken from. Roots elsewhere are restored where they were.
const PAXWorkdir = "QUARRY.workdir"

// Compression levels of a checkpoint (the compression query parameter):
// CompressionNone is a plain tar (FormatTar), the others gzip
// (FormatTarGzip).
const (
	// CompressionFast (the default) is Huffman coding only: about four
	// times the speed of deflate's fastest level, for two thirds of its
	// gain.
	CompressionFast = "fast"
	// CompressionNone is no compression, a plain tar (FormatTar): the speed
	// of a copy.
	CompressionNone = "none"
	// CompressionSmall is deflate's fastest level.
	CompressionSmall = "small"
)

// Routes served by the agent. Every route requires "Authorization: Bearer <token>".
// JSON request bodies are decoded strictly: a field the request type does not
// have is refused with 400 naming it ("timeout: unknown field ..."). A
// running exec, session run or rpc call that the agent kills because it is
// shutting down (the sandbox is being stopped) answers 410 CodeGone — an
// "error" event for a streaming exec — never a result.
const (
	RouteHealth        = "/healthz"
	RouteInit          = "/v1/init"
	RouteExec          = "/v1/exec"
	RouteSessions      = "/v1/sessions"              // POST create, GET list
	RouteSession       = "/v1/sessions/{id}"         // DELETE close
	RouteSessionRun    = "/v1/sessions/{id}/run"     // POST run
	RouteProcesses     = "/v1/processes"             // POST start, GET list
	RouteProcess       = "/v1/processes/{id}"        // GET status, DELETE kill+forget
	RouteProcessOutput = "/v1/processes/{id}/output" // GET (JSON page or SSE)
	RouteProcessSignal = "/v1/processes/{id}/signal" // POST
	RouteProcessStdin  = "/v1/processes/{id}/stdin"  // POST raw bytes (?close=true)
	RouteProcessCall   = "/v1/processes/{id}/call"   // POST one JSON line in, one line out (rpc processes)
	RouteCall          = "/v1/calls/{id}"            // DELETE: cancel the request carrying that X-Quarry-Call-Id
	RouteFiles         = "/v1/files"                 // GET read, PUT write (?path=&exclusive=), DELETE remove
	RouteFileStat      = "/v1/files/stat"            // GET (?path=)
	RouteFileList      = "/v1/files/list"            // GET (?path=)
	RouteFileArchive   = "/v1/files/archive"         // GET tar of a dir, PUT tar(.gz) to extract (?path=)
	RouteKillAll       = "/v1/kill-all"              // POST: SIGKILL to every process but the agent
	RoutePidWait       = "/v1/pids/{pid}/wait"       // POST: wait until a process of the sandbox exits, or a timeout (PidWaitRequest)
	// RouteCheckpoint: GET a checkpoint archive of paths
	// (?path=&path=&exclude=&compression=), PUT one back atomically
	// (?sha256=), answered with RestoreResult. See docs/ARCHITECTURE.md,
	// "Checkpoints: the agent's side".
	RouteCheckpoint = "/v1/checkpoint"
)

// Error codes the agent answers, in ErrorBody. They are api's codes (the
// gateway passes them on) but CodeStaleGeneration, the agent's alone, which
// the gateway answers as api.CodeGone.
const (
	CodeBadRequest       = api.CodeBadRequest
	CodeUnauthorized     = api.CodeUnauthorized
	CodeForbidden        = api.CodeForbidden
	CodeNotFound         = api.CodeNotFound
	CodeConflict         = api.CodeConflict
	CodeBusy             = api.CodeBusy // e.g. a session already running a command
	CodeGone             = api.CodeGone // shutting down: the command was killed
	CodeTooLarge         = api.CodeTooLarge
	CodeTimeout          = api.CodeTimeout
	CodeAgentUnreachable = api.CodeAgentUnreachable // the model relay is unreachable from the sandbox
	CodeUnavailable      = api.CodeUnavailable
	CodeInternal         = api.CodeInternal
	// CodeStaleGeneration: the call's generation is older than the
	// agent's (409): a newer lease holds the sandbox.
	CodeStaleGeneration     = "stale_generation"
	CodeProcessExited       = api.CodeProcessExited
	CodeNoReply             = api.CodeNoReply
	CodeNameInUse           = api.CodeNameInUse
	CodeProtocolError       = api.CodeProtocolError
	CodeInsufficientStorage = api.CodeInsufficientStorage
	CodePidsLimit           = api.CodePidsLimit
)

// ErrorBody is the one JSON shape of every error response, from the agent and
// from the gateway: {"error": {"code": "...", "message": "..."}}.
type ErrorBody = api.ErrorBody

// ErrorDetail is the inner object of ErrorBody.
type ErrorDetail = api.ErrorDetail

// Health is the answer of GET /healthz and POST /v1/init.
type Health struct {
	Status     string `json:"status"` // "ok"
	Version    string `json:"version"`
	LeaseID    string `json:"lease_id,omitempty"`
	Generation int64  `json:"generation"`
	UptimeMS   int64  `json:"uptime_ms"`
}

// InitRequest applies per-lease settings after a claim. Generation must be
// greater than or equal to the agent's current one (equal with the same lease
// id is an idempotent retry); Env is added to the environment of every later
// command, session and process. An init that keeps the current lease id and
// raises the generation fences the lease (the manager does so when the lease
// ended): the agent then holds no lease, and may exit when idle
// (QUARRY_AGENT_IDLE_EXIT).
type InitRequest struct {
	LeaseID    string            `json:"lease_id"`
	Generation int64             `json:"generation"`
	Env        map[string]string `json:"env,omitempty"`
}

// ExecRequest runs one command to completion. Exactly one of Command (run by
// bash -c, or /bin/sh -c when the image has no bash) and Argv must be set.
// A Command over 64 KiB is run from a private script file instead of -c
// (same semantics, but $0 names the file). Env names are shell variable
// names (letters, digits and _, not starting with a digit) and values are
// passed on exactly; an argument or variable over the kernel's limit for a
// new process (128 KiB each, and a total) is refused with 400 naming argv
// or env — the same rules hold for sessions, processes and init.
type ExecRequest struct {
	Command string            `json:"command,omitempty"`
	Argv    []string          `json:"argv,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	// Stdin is the command's standard input as text; StdinBase64 is the
	// same as standard base64 (RFC 4648, padded), for bytes that are not
	// UTF-8 text (JSON cannot carry them in a string). Set at most one; a
	// StdinBase64 that is not base64 is refused with 400 naming it. Neither:
	// stdin is /dev/null.
	Stdin       string `json:"stdin,omitempty"`
	StdinBase64 string `json:"stdin_base64,omitempty"`
	// TimeoutMS bounds the run; on expiry the whole process group is killed.
	// 0 means the agent's default; values above the agent's maximum are refused.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxOutputBytes caps each of stdout and stderr, in bytes of output
	// (whatever the Encoding); 0 means the default, above the agent's
	// maximum is refused with 400.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// Encoding is how output is carried: in Stdout and Stderr of the
	// result and in the Data of stdout/stderr events. EncodingUTF8 (also
	// "") is text, bytes that are not valid UTF-8 becoming U+FFFD;
	// EncodingBase64 is the exact bytes (each event's Data decodes on its
	// own). Any other value is refused with 400.
	Encoding string `json:"encoding,omitempty"`
	// UnlimitedOutput, for a streaming exec only, streams all the output
	// however much there is: the agent holds a few chunks at a time, and a
	// reader slower than the command slows the command down (its pipe
	// fills). Truncated is then always false. Set with MaxOutputBytes, or
	// on an exec answered with JSON (held whole in memory), it is refused
	// with 400.
	UnlimitedOutput bool `json:"unlimited_output,omitempty"`
}

// Output encodings of ExecRequest.Encoding.
const (
	EncodingUTF8   = "utf-8"
	EncodingBase64 = "base64"
)

// ExecResult is the answer of a non-streaming exec.
type ExecResult struct {
	// ExitCode is the process's exit status, or -1 when it was killed by a
	// signal (then Signal names it, e.g. "SIGKILL"). A command that timed
	// out (TimedOut) always has -1: the agent killed its process group at
	// the deadline (Signal "SIGKILL"); a command that had exited before its
	// deadline keeps its own status, however late its answer.
	ExitCode   int    `json:"exit_code"`
	Signal     string `json:"signal,omitempty"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMS int64  `json:"duration_ms"`
	TimedOut   bool   `json:"timed_out"`
	// Stdout and Stderr are carried in the request's Encoding.
	// Truncated is true when stdout or stderr exceeded MaxOutputBytes; the
	// excess was discarded (the command was not stopped).
	Truncated bool `json:"truncated"`
	// OOMKilled is true when the kernel's OOM killer killed the command:
	// it died of SIGKILL (or its shell reported 137 for a command it ran)
	// and the sandbox's memory cgroup counted an OOM kill while it ran
	// (cgroup v2 memory.events, v1 memory.oom_control: oom_kill). Never
	// set for a command the agent killed (a timeout, a cancelled call), nor
	// where the agent finds no such counter.
	OOMKilled bool `json:"oom_killed,omitempty"`
}

// Server-sent events of a streaming exec (Accept: text/event-stream) and of a
// followed process output. Data of "stdout"/"stderr"/"output" events is a
// StreamChunk, of "exit" an ExecResult without Stdout/Stderr (or a
// ProcessInfo for processes), of "error" an ErrorDetail. Comment lines
// (": keep-alive") are sent while nothing else is.
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventOutput = "output"
	EventExit   = "exit"
	EventError  = "error"
)

// StreamChunk is the data of an output event. Of an exec's stdout/stderr
// events, Data is in the request's Encoding.
type StreamChunk struct {
	Data   string `json:"data"`
	Offset int64  `json:"offset,omitempty"` // processes: byte offset of Data in the output
}

// SessionCreateRequest starts a persistent shell session.
type SessionCreateRequest struct {
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
}

// SessionInfo describes a session.
type SessionInfo struct {
	ID        string    `json:"id"`
	Shell     string    `json:"shell"` // "bash" or "sh"
	Busy      bool      `json:"busy"`
	CreatedAt time.Time `json:"created_at"`
}

// SessionList is the answer of GET /v1/sessions.
type SessionList struct {
	Sessions []SessionInfo `json:"sessions"`
}

// SessionRunRequest runs one command in a session. Shell state (cwd,
// variables, functions) persists between runs, and each run starts with $?
// set to the previous run's exit code. Command is required. A run on a
// session that is already running a command is refused with 409 (code
// "busy").
type SessionRunRequest struct {
	Command        string `json:"command"`
	TimeoutMS      int64  `json:"timeout_ms,omitempty"`
	MaxOutputBytes int64  `json:"max_output_bytes,omitempty"`
}

// SessionRunResult is the answer of a session run. Output holds stdout and
// stderr interleaved as the shell wrote them.
type SessionRunResult struct {
	// ExitCode is the command's exit status; a run that timed out
	// (TimedOut) reports 130 (128+SIGINT: the agent interrupted it) or,
	// when the shell ended meanwhile (Closed), the shell's status (128+n
	// for signal n); never 0.
	ExitCode   int    `json:"exit_code"`
	Output     string `json:"output"`
	DurationMS int64  `json:"duration_ms"`
	TimedOut   bool   `json:"timed_out"`
	Truncated  bool   `json:"truncated"`
	// Closed is true when the command ended the shell (e.g. "exit 3"); the
	// session is gone and later runs return 404.
	Closed bool `json:"closed,omitempty"`
}

// ProcessStartRequest starts a background process. Exactly one of Command
// and Argv must be set. With Stdin true the process keeps a stdin pipe that
// POST .../stdin writes to; otherwise its stdin is /dev/null.
type ProcessStartRequest struct {
	Command string            `json:"command,omitempty"`
	Argv    []string          `json:"argv,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"`
	// Name, when set, names the process: every /v1/processes/{id} route
	// accepts it in place of the id. It is 1 to 63 letters, digits, '.', '_'
	// or '-', starting with a letter or digit and not with "proc-". It is
	// unique among running processes (a start with the name of a running
	// process is refused with 409 name_in_use); an exited process of the
	// same name is forgotten and replaced.
	Name string `json:"name,omitempty"`
	// RPC (implies Stdin) keeps the process's stdout for protocol replies,
	// read one line per POST .../call; only stderr goes to the output ring.
	RPC bool `json:"rpc,omitempty"`
}

// ProcessCallRequest is one call of an rpc process: Request (one JSON value)
// is written to its stdin as one line, and the next line of its stdout is
// the reply. One call runs at a time per process (another is refused with
// 409 busy). When the process had exited the answer is 409
// process_exited, when it exits before replying 409 no_reply; when the reply is not one JSON value or is over
// MaxReplyBytes, or no reply comes within TimeoutMS, the agent kills the
// process (its replies could no longer be matched to calls) and answers 409
// protocol_error or 504 timeout.
type ProcessCallRequest struct {
	Request json.RawMessage `json:"request"`
	// TimeoutMS bounds the wait for the reply; 0 means the agent's default
	// timeout, above its maximum is refused.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxReplyBytes bounds the reply line; 0 means 1 MiB, above the agent's
	// MaxOutputBytes is refused.
	MaxReplyBytes int64 `json:"max_reply_bytes,omitempty"`
}

// ProcessCallResult is the answer of a successful call.
type ProcessCallResult struct {
	Reply      json.RawMessage `json:"reply"`
	DurationMS int64           `json:"duration_ms"`
}

// Process states.
const (
	ProcessRunning = "running"
	ProcessExited  = "exited"
)

// ProcessInfo describes a background process.
type ProcessInfo struct {
	ID          string     `json:"id"`
	Name        string     `json:"name,omitempty"`
	RPC         bool       `json:"rpc,omitempty"`
	PID         int        `json:"pid"`
	Command     string     `json:"command,omitempty"`
	Argv        []string   `json:"argv,omitempty"`
	State       string     `json:"state"`
	ExitCode    *int       `json:"exit_code,omitempty"` // set once exited; -1 when killed by a signal
	Signal      string     `json:"signal,omitempty"`
	StartedAt   time.Time  `json:"started_at"`
	EndedAt     *time.Time `json:"ended_at,omitempty"`
	OutputBytes int64      `json:"output_bytes"` // total bytes written so far (stdout+stderr)
	// OOMKilled: the process was killed by the kernel's OOM killer, as
	// ExecResult.OOMKilled says.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// GroupRunning: the process has exited (ExitCode is its own), but
	// processes it started in its process group still run (a background
	// job, a fork bomb): DELETE kills them with it, kill-all kills every
	// process of the sandbox.
	GroupRunning bool `json:"group_running,omitempty"`
}

// ProcessList is the answer of GET /v1/processes.
type ProcessList struct {
	Processes []ProcessInfo `json:"processes"`
}

// ProcessOutput is one page of a process's combined output, read from Offset.
// The agent retains a bounded tail of the output; when Offset is older than
// what is retained, reading starts at the oldest retained byte and Dropped
// says how many bytes were skipped.
type ProcessOutput struct {
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	Data       string `json:"data"`
	Dropped    int64  `json:"dropped,omitempty"`
	State      string `json:"state"`
	ExitCode   *int   `json:"exit_code,omitempty"`
}

// SignalRequest sends a signal to a process's group. Signal is a name
// ("TERM", "SIGKILL") or a number ("9").
type SignalRequest struct {
	Signal string `json:"signal"`
}

// FileInfo describes one file system entry.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // e.g. "0644"
	IsDir   bool      `json:"is_dir"`
	Symlink string    `json:"symlink,omitempty"` // link target when the entry is a symlink
	ModTime time.Time `json:"mod_time"`
}

// FileList is the answer of GET /v1/files/list.
type FileList struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
}

// PidWaitRequest is the body of POST /v1/pids/{pid}/wait: wait until
// process pid of the sandbox has exited, or TimeoutMS has passed, or the
// caller leaves. With Marker set, the agent waits only when that file
// exists (a marker the process's starter left right after starting it)
// and the process started before the marker was written (it is the
// process the marker names, not a later one with its pid); otherwise it
// answers at once with Skipped. The agent removes the marker once the
// process is gone.
type PidWaitRequest struct {
	TimeoutMS int64  `json:"timeout_ms"`
	Marker    string `json:"marker,omitempty"`
}

// PidWaitResult is the answer of POST /v1/pids/{pid}/wait: Exited when the
// process is gone (it exited and its parent reaped it, or no such process
// existed), Skipped when the marker was missing (nothing was waited for).
// A process that exited but that its parent has not reaped yet is not
// Exited: "kill -0" still finds it.
type PidWaitResult struct {
	Exited   bool  `json:"exited"`
	Skipped  bool  `json:"skipped,omitempty"`
	WaitedMS int64 `json:"waited_ms"`
}

// KillAllResult is the answer of POST /v1/kill-all, which sends SIGKILL to
// every process in the sandbox but the agent: where the agent is PID 1 of
// the sandbox's pid namespace (Docker, ECS) every other process there,
// otherwise (the process provider) every process below the agent in the
// process tree (it is their subreaper). Session shells die too: sessions
// end and must be created again; background processes stay listed as
// exited by SIGKILL until they are deleted; commands running meanwhile
// answer as killed by SIGKILL. The body is empty or {}.
type KillAllResult struct {
	// Killed is how many processes SIGKILL killed: every process that ran
	// when the agent sent it, those a fork bomb forked meanwhile included,
	// not those that had exited already.
	Killed int `json:"killed"`
	// Threads is how many threads those processes had (one at least
	// each): a pids limit counts threads, not processes, so a sandbox of
	// two programs with 400 threads each has 800 pids and Killed 2.
	Threads int `json:"threads"`
	// Left is how many were still running when the agent gave up (after
	// 10 s: a process stuck in the kernel); normally 0.
	Left       int   `json:"left"`
	DurationMS int64 `json:"duration_ms"`
}

// WriteResult is the answer of PUT /v1/files and PUT /v1/files/archive.
type WriteResult struct {
	Path    string `json:"path,omitempty"` // files and archives; absent for process stdin
	Bytes   int64  `json:"bytes"`
	Entries int    `json:"entries,omitempty"` // archive: entries extracted
}

// CheckpointInfo describes a checkpoint archive, from the headers the agent
// sent before its body.
type CheckpointInfo struct {
	Format  string   // HeaderFormat: FormatTarGzip
	Files   int      // HeaderFiles: entries in the archive (directories, files, symlinks)
	Skipped int      // HeaderSkipped: special files left out
	Bytes   int64    // HeaderBytes: bytes of regular files, uncompressed
	Roots   []string // HeaderRoots: the roots, absolute
}

// RestoreResult is the answer of PUT RouteCheckpoint: the entries restored,
// the bytes of their regular files, and how long the restore took (from the
// first byte of the body to the end of the cleanup).
type RestoreResult struct {
	Files      int   `json:"files"`
	Bytes      int64 `json:"bytes"`
	DurationMS int64 `json:"duration_ms"`
}
