package faults

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// Kind is what an operation did.
type Kind string

// The operations a history holds. Lose is the nemesis's: it killed the
// sandbox of a lease from outside (its agent), which may end the lease.
const (
	Acquire   Kind = "acquire"
	Exec      Kind = "exec"
	Heartbeat Kind = "heartbeat"
	Release   Kind = "release"
	Lose      Kind = "lose"
	// Checkpoint and Restore are calls on a lease, as Exec is: they need
	// it active.
	Checkpoint Kind = "checkpoint"
	Restore    Kind = "restore"
	// Relay is a model call from inside the sandbox through the gateway's
	// relay, answered by the trainer: a call on the lease, as Exec is.
	Relay Kind = "relay"
)

// Outcome is what a client learned from an operation's answer.
type Outcome string

const (
	// OK: the operation happened.
	OK Outcome = "ok"
	// Refused: the gateway answered that the lease is not active (404 or
	// 410): the operation did not happen.
	Refused Outcome = "refused"
	// Unknown: no answer, or an error that leaves open whether the
	// operation happened (a reset connection, 502, 503, a deadline). An
	// unknown operation may take effect at any time after its call.
	Unknown Outcome = "unknown"
)

// Op is one recorded operation: who called, what, on which lease, when the
// call began and when its answer came (since the recorder started), and
// what the answer said.
type Op struct {
	ID      int64         `json:"id"`
	Client  int           `json:"client"`  // -1: the nemesis
	Replica int           `json:"replica"` // the replica called, -1 when none
	Kind    Kind          `json:"kind"`
	Lease   string        `json:"lease,omitempty"` // "" for an acquire whose answer never came
	Call    time.Duration `json:"call"`
	Return  time.Duration `json:"return"`
	Outcome Outcome       `json:"outcome"`
	// Code is the error's code (Quarry's API code, "transport" or
	// "deadline"); "" when OK.
	Code string `json:"code,omitempty"`
	Err  string `json:"err,omitempty"`
	// Task is the task (sandbox) the operation saw, when its answer named
	// it: an exec prints its working directory.
	Task string `json:"task,omitempty"`
	// Checkpoint is the checkpoint an operation made (Checkpoint) or
	// restored (Restore).
	Checkpoint string `json:"checkpoint,omitempty"`
	// Marked: an exec whose command leaves a marker named by ID when it
	// runs, so that the checker can tell whether a refused command ran.
	Marked bool `json:"marked,omitempty"`
	// Wrong: what a relay call got that was not the answer to its own
	// request (another request's answer).
	Wrong string `json:"wrong,omitempty"`
	// Late: the call ended after its deadline (Code "deadline"), or its
	// answer took longer than the run's bound on any call.
	Late bool `json:"late,omitempty"`
}

// String is the operation as one line of a history.
func (o Op) String() string {
	var b strings.Builder
	who := fmt.Sprintf("c%d", o.Client)
	if o.Client < 0 {
		who = "nemesis"
	}
	fmt.Fprintf(&b, "#%d %-8s %-9s %s [%.3fs, %.3fs] r%d %s", o.ID, who, o.Kind, o.Lease,
		o.Call.Seconds(), o.Return.Seconds(), o.Replica, o.Outcome)
	if o.Code != "" {
		fmt.Fprintf(&b, " %s", o.Code)
	}
	if o.Task != "" {
		fmt.Fprintf(&b, " task=%s", o.Task)
	}
	if o.Err != "" {
		fmt.Fprintf(&b, " (%s)", o.Err)
	}
	return b.String()
}

// Recorder collects a history. It is safe for concurrent use.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	next  int64
	ops   []Op
}

// NewRecorder starts a history now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now is the time since the recorder started (monotonic).
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Begin reserves an operation's ID and stamps its call. The caller fills
// the answer in and passes it to End.
func (r *Recorder) Begin(client, replica int, kind Kind, lease string) Op {
	r.mu.Lock()
	r.next++
	id := r.next
	r.mu.Unlock()
	return Op{ID: id, Client: client, Replica: replica, Kind: kind, Lease: lease, Call: r.Now()}
}

// End stamps the operation's return and records it.
func (r *Recorder) End(op Op) Op {
	op.Return = r.Now()
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
	return op
}

// Ops returns the history so far, ordered by call.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	out := append([]Op(nil), r.ops...)
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Call < out[j].Call })
	return out
}

// WriteJSON writes the history as JSON lines, one operation each, ordered
// by call: the file a failed run leaves for replaying its check.
func WriteJSON(w io.Writer, ops []Op) error {
	enc := json.NewEncoder(w)
	for _, o := range ops {
		if err := enc.Encode(o); err != nil {
			return fmt.Errorf("write history: %w", err)
		}
	}
	return nil
}

// ReadJSON reads a history written by WriteJSON.
func ReadJSON(r io.Reader) ([]Op, error) {
	var ops []Op
	dec := json.NewDecoder(r)
	for dec.More() {
		var o Op
		if err := dec.Decode(&o); err != nil {
			return nil, fmt.Errorf("read history: %w", err)
		}
		ops = append(ops, o)
	}
	return ops, nil
}
