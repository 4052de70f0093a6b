package faults

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// op builds an operation for a hand-written history; times in ms.
func op(id int64, client int, k Kind, lease string, call, ret int, out Outcome) Op {
	return Op{ID: id, Client: client, Kind: k, Lease: lease, Outcome: out,
		Call: time.Duration(call) * time.Millisecond, Return: time.Duration(ret) * time.Millisecond}
}

func rules(vs []Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Rule)
	}
	return out
}

func TestCheck_Histories(t *testing.T) {
	tests := []struct {
		name string
		ops  []Op
		want []string // the rules broken, in order; nil: none
	}{
		{"a lease's life", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Exec, "L1", 11, 20, OK),
			op(3, 0, Heartbeat, "L1", 21, 30, OK),
			op(4, 0, Release, "L1", 31, 40, OK),
			op(5, 0, Exec, "L1", 41, 50, Refused),
		}, nil},
		{"an exec that succeeds after the release was acknowledged", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Release, "L1", 11, 20, OK),
			op(3, 1, Exec, "L1", 21, 30, OK),
		}, []string{RuleLinearizable}},
		{"an exec concurrent with the release may succeed", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Release, "L1", 11, 30, OK),
			op(3, 1, Exec, "L1", 20, 40, OK),
		}, nil},
		{"a lease refused, then usable again", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Exec, "L1", 11, 20, Refused),
			op(3, 0, Exec, "L1", 21, 30, OK),
		}, []string{RuleLinearizable}},
		{"a release whose answer was lost, then refused as ended", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Release, "L1", 11, 20, Unknown),
			op(3, 0, Release, "L1", 21, 30, Refused),
			op(4, 0, Exec, "L1", 31, 40, Refused),
		}, nil},
		{"a release whose answer was lost may not have happened", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Release, "L1", 11, 20, Unknown),
			op(3, 0, Exec, "L1", 21, 30, OK),
			op(4, 0, Release, "L1", 31, 40, OK),
		}, nil},
		{"a lease ended without a release or a loss", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Exec, "L1", 11, 20, Refused),
		}, []string{RuleLinearizable}},
		{"a lease ended after its sandbox was killed", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, -1, Lose, "L1", 11, 12, Unknown),
			op(3, 0, Exec, "L1", 13, 20, Refused),
		}, nil},
		{"an operation on a lease before its grant", []Op{
			op(1, 0, Exec, "L1", 0, 5, OK),
			op(2, 0, Acquire, "L1", 10, 20, OK),
		}, []string{RuleLinearizable}},
		{"an idempotent acquire answered twice", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Acquire, "L1", 11, 20, OK),
			op(3, 0, Release, "L1", 21, 30, OK),
		}, nil},
		{"a checkpoint and a restore while active, a checkpoint refused after the release", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Checkpoint, "L1", 11, 20, OK),
			op(3, 0, Restore, "L1", 21, 30, OK),
			op(4, 0, Release, "L1", 31, 40, OK),
			op(5, 0, Checkpoint, "L1", 41, 50, Refused),
		}, nil},
		{"a restore that succeeds after the release was acknowledged", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			op(2, 0, Release, "L1", 11, 20, OK),
			op(3, 0, Restore, "L1", 21, 30, OK),
		}, []string{RuleLinearizable}},
		{"a relayed call answered with another call's answer", []Op{
			op(1, 0, Acquire, "L1", 0, 10, OK),
			{ID: 2, Kind: Relay, Lease: "L1", Outcome: OK, Call: 11 * time.Millisecond, Return: 20 * time.Millisecond, Wrong: "answer to: relay-7"},
		}, []string{RuleOwnAnswer}},
		{"a call that outlived its deadline", []Op{
			{ID: 1, Kind: Acquire, Lease: "L1", Outcome: Unknown, Code: "deadline", Late: true, Return: time.Minute},
		}, []string{RuleEveryCallEnds}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.ops, nil, 10*time.Second)
			assert.Equal(t, tc.want, rules(got), "%v", got)
		})
	}
}

func TestCheck_OneHolder(t *testing.T) {
	a := op(1, 0, Exec, "L1", 0, 10, OK)
	a.Task = "t1"
	b := op(2, 1, Exec, "L2", 5, 15, OK)
	b.Task = "t1"
	c := op(3, 1, Exec, "L2", 20, 25, OK)
	c.Task = "t2"
	acq := []Op{op(4, 0, Acquire, "L1", 0, 0, OK), op(5, 1, Acquire, "L2", 0, 0, OK)}
	got := Check(append(acq, a, b, c), nil, time.Second)
	require.Len(t, got, 1, "%v", got)
	assert.Equal(t, RuleOneHolder, got[0].Rule)
	assert.Contains(t, got[0].Detail, "t1")
}

func TestCheck_Markers(t *testing.T) {
	ops := []Op{
		op(1, 0, Acquire, "L1", 0, 10, OK),
		op(2, 0, Exec, "L1", 11, 20, OK),      // ran: fine
		op(3, 0, Exec, "L1", 21, 30, OK),      // did not run: broken
		op(4, 0, Release, "L1", 31, 40, OK),   //
		op(5, 0, Exec, "L1", 41, 50, Refused), // ran: broken
		op(6, 0, Exec, "L1", 51, 60, Refused), // did not run: fine
		op(7, 0, Exec, "L1", 61, 70, Unknown), // either: fine
	}
	for i := range ops {
		ops[i].Marked = ops[i].Kind == Exec
	}
	ran := map[int64]bool{2: true, 5: true, 7: true}
	got := Check(ops, func(id int64) bool { return ran[id] }, time.Second)
	assert.Equal(t, []string{RuleAcknowledgedRan, RuleRefusedNeverRan}, rules(got))
	assert.Equal(t, int64(3), got[0].Ops[0].ID)
	assert.Equal(t, int64(5), got[1].Ops[0].ID)
}

func TestHistory_JSONRoundTrip(t *testing.T) {
	r := NewRecorder()
	o := r.Begin(2, 1, Exec, "L1")
	o.Outcome, o.Task, o.Marked = OK, "t9", true
	r.End(o)
	var b bytes.Buffer
	require.NoError(t, WriteJSON(&b, r.Ops()))
	back, err := ReadJSON(&b)
	require.NoError(t, err)
	assert.Equal(t, r.Ops(), back)
}

func TestSchedule_SameSeedSamePlan(t *testing.T) {
	a := Schedule(42, time.Minute, 3, AllFaults, 2*time.Second, time.Second, 4*time.Second)
	b := Schedule(42, time.Minute, 3, AllFaults, 2*time.Second, time.Second, 4*time.Second)
	c := Schedule(43, time.Minute, 3, AllFaults, 2*time.Second, time.Second, 4*time.Second)
	require.NotEmpty(t, a)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, c)
	var end time.Duration
	for _, f := range a {
		assert.GreaterOrEqual(t, f.At, end+2*time.Second, "one fault at a time, with a gap: %v", f)
		assert.LessOrEqual(t, f.At+f.For, time.Minute)
		assert.Less(t, f.Target, 3)
		end = f.At + f.For
	}
}
