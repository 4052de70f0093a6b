package faults

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Rules a history is checked against (Violation.Rule).
const (
	// RuleLinearizable: each lease's operations are linearizable against
	// the lease model (leaseModel): no operation succeeds on a lease
	// before it was granted or after it ended, and nothing refused as
	// ended comes back.
	RuleLinearizable = "linearizable"
	// RuleOneHolder: a task (sandbox) is held by one lease in its life.
	// Quarry never hands a task out twice: a released task stops.
	RuleOneHolder = "one-holder"
	// RuleRefusedNeverRan: a command the gateway refused (the lease had
	// ended) left no trace in the sandbox.
	RuleRefusedNeverRan = "refused-never-ran"
	// RuleAcknowledgedRan: a command answered with success ran.
	RuleAcknowledgedRan = "acknowledged-ran"
	// RuleEveryCallEnds: every call ended within its deadline, with a
	// result or a classified error.
	RuleEveryCallEnds = "every-call-ends"
	// RuleOwnAnswer: a relayed model call got the answer to its own
	// request, never another's.
	RuleOwnAnswer = "own-answer"
)

// Violation is one broken rule, with the operations that show it.
type Violation struct {
	Rule   string
	Detail string
	Ops    []Op
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", v.Rule, v.Detail)
	for _, o := range v.Ops {
		b.WriteString("\n    ")
		b.WriteString(o.String())
	}
	return b.String()
}

// Check checks a history against every rule. ran says whether the marker
// of an operation (by ID) was found in its sandbox; nil skips the two
// marker rules. timeout bounds the linearizability search of each lease
// (porcupine's); a lease whose search times out is reported, not passed.
func Check(ops []Op, ran func(id int64) bool, timeout time.Duration) []Violation {
	var out []Violation
	out = append(out, checkLinearizable(ops, timeout)...)
	out = append(out, checkOneHolder(ops)...)
	if ran != nil {
		out = append(out, checkMarkers(ops, ran)...)
	}
	for _, o := range ops {
		if o.Wrong != "" {
			out = append(out, Violation{Rule: RuleOwnAnswer, Ops: []Op{o},
				Detail: fmt.Sprintf("the relayed call got %q", o.Wrong)})
		}
		if o.Late {
			out = append(out, Violation{Rule: RuleEveryCallEnds,
				Detail: fmt.Sprintf("the call took %.1fs", (o.Return - o.Call).Seconds()), Ops: []Op{o}})
		}
	}
	return out
}

// Lease states in the model.
const (
	notGranted = iota
	active
	ended
)

// leaseModel is the sequential specification of one lease: it is granted
// (acquire, idempotent under its key), used (exec, heartbeat) while active,
// and ended once (release, or its sandbox lost). An unknown outcome may or
// may not have taken effect, so the model is nondeterministic.
var leaseModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{notGranted} },
	Step: func(state, input, _ any) []any {
		s, o := state.(int), input.(Op)
		return leaseStep(s, o.Kind, o.Outcome)
	},
	DescribeOperation: func(input, _ any) string { return input.(Op).String() },
	DescribeState: func(state any) string {
		return [...]string{"not granted", "active", "ended"}[state.(int)]
	},
}

// leaseStep is the model's transition: the states a lease in state s may
// be in after an operation of kind k answered with outcome out (none: the
// answer is impossible in s).
func leaseStep(s int, k Kind, out Outcome) []any {
	switch k {
	case Acquire:
		if out == OK && s != ended {
			return []any{active}
		}
		if out != OK && s == notGranted {
			return []any{notGranted, active}
		}
		if out != OK {
			return []any{s}
		}
	case Exec, Heartbeat, Checkpoint, Restore, Relay:
		switch {
		case out == OK && s == active, out == Refused && s == ended, out == Unknown:
			return []any{s}
		}
	case Release:
		switch {
		case out == OK && s == active:
			return []any{ended}
		case out == Refused && s == ended:
			return []any{ended}
		case out == Unknown && s == active:
			return []any{active, ended}
		case out == Unknown:
			return []any{s}
		}
	case Lose:
		if s == active {
			return []any{active, ended}
		}
		return []any{s}
	}
	return nil
}

// checkLinearizable runs porcupine over each lease's operations. An
// operation with an unknown outcome is pending from its call to the end of
// the history: it may have taken effect at any time after it began.
func checkLinearizable(ops []Op, timeout time.Duration) []Violation {
	var end time.Duration
	for _, o := range ops {
		end = max(end, o.Return)
	}
	byLease := map[string][]porcupine.Operation{}
	var leases []string
	for _, o := range ops {
		if o.Lease == "" {
			continue // an acquire that named no lease: nothing else refers to it
		}
		if _, ok := byLease[o.Lease]; !ok {
			leases = append(leases, o.Lease)
		}
		ret := o.Return
		if o.Outcome == Unknown {
			ret = end + time.Second
		}
		byLease[o.Lease] = append(byLease[o.Lease], porcupine.Operation{ClientId: max(o.Client, 0),
			Input: o, Output: o.Outcome, Call: int64(o.Call), Return: int64(ret)})
	}
	sort.Strings(leases)
	model := leaseModel.ToModel()
	var out []Violation
	for _, l := range leases {
		h := byLease[l]
		switch porcupine.CheckOperationsTimeout(model, h, timeout) {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			out = append(out, Violation{Rule: RuleLinearizable, Ops: inputs(h),
				Detail: fmt.Sprintf("lease %s: the search did not end within %s", l, timeout)})
		default:
			out = append(out, Violation{Rule: RuleLinearizable, Ops: inputs(h),
				Detail: fmt.Sprintf("lease %s: no order of its operations fits the lease model", l)})
		}
	}
	return out
}

func inputs(h []porcupine.Operation) []Op {
	out := make([]Op, len(h))
	for i, o := range h {
		out[i] = o.Input.(Op)
	}
	return out
}

// checkOneHolder finds a task seen by two leases.
func checkOneHolder(ops []Op) []Violation {
	first := map[string]Op{}
	var out []Violation
	for _, o := range ops {
		if o.Task == "" || o.Lease == "" {
			continue
		}
		prev, ok := first[o.Task]
		if !ok {
			first[o.Task] = o
			continue
		}
		if prev.Lease != o.Lease {
			out = append(out, Violation{Rule: RuleOneHolder, Ops: []Op{prev, o},
				Detail: fmt.Sprintf("task %s was seen by leases %s and %s", o.Task, prev.Lease, o.Lease)})
			first[o.Task] = o
		}
	}
	return out
}

// checkMarkers compares each marked command's answer with what the
// sandbox shows: a refused command must have left no marker, an
// acknowledged one must have.
func checkMarkers(ops []Op, ran func(int64) bool) []Violation {
	var out []Violation
	for _, o := range ops {
		if !o.Marked {
			continue
		}
		switch {
		case o.Outcome == Refused && ran(o.ID):
			out = append(out, Violation{Rule: RuleRefusedNeverRan, Ops: []Op{o},
				Detail: "the gateway refused the command, and it ran"})
		case o.Outcome == OK && !ran(o.ID):
			out = append(out, Violation{Rule: RuleAcknowledgedRan, Ops: []Op{o},
				Detail: "the gateway answered success, and the command left no marker"})
		}
	}
	return out
}
