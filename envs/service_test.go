package envs

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
)

// fakeSandboxes is a scriptable Sandboxes: the function fields replace an
// operation; by default one sandbox "sbx-1" labelled with env "game" whose
// agent is Agent.
type fakeSandboxes struct {
	AcquireFn func(ctx context.Context, req AcquireRequest) (string, error)
	OpenFn    func(ctx context.Context, owner, id string) (Sandbox, error)
	Agent     *fakeAgent

	mu       sync.Mutex
	acquired []AcquireRequest
	released []string
}

func (f *fakeSandboxes) Acquire(ctx context.Context, req AcquireRequest) (string, error) {
	f.mu.Lock()
	f.acquired = append(f.acquired, req)
	f.mu.Unlock()
	if f.AcquireFn != nil {
		return f.AcquireFn(ctx, req)
	}
	return "sbx-1", nil
}

func (f *fakeSandboxes) Open(ctx context.Context, owner, id string) (Sandbox, error) {
	if f.OpenFn != nil {
		return f.OpenFn(ctx, owner, id)
	}
	return Sandbox{Labels: map[string]string{LabelEnv: "game"}, Agent: f.Agent}, nil
}

func (f *fakeSandboxes) Release(ctx context.Context, owner, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, id)
	return nil
}

// fakeAgent is a scriptable Agent that records its calls.
type fakeAgent struct {
	StartFn func(req agentapi.ProcessStartRequest) error
	CallFn  func(n int, line string) (string, error) // n counts calls from 0

	mu     sync.Mutex
	starts []agentapi.ProcessStartRequest
	lines  []string
}

func (a *fakeAgent) StartProcess(ctx context.Context, req agentapi.ProcessStartRequest) (agentapi.ProcessInfo, error) {
	a.mu.Lock()
	a.starts = append(a.starts, req)
	a.mu.Unlock()
	if a.StartFn != nil {
		return agentapi.ProcessInfo{}, a.StartFn(req)
	}
	return agentapi.ProcessInfo{ID: "proc-1", Name: req.Name}, nil
}

func (a *fakeAgent) CallProcess(ctx context.Context, id string, req agentapi.ProcessCallRequest) (agentapi.ProcessCallResult, error) {
	a.mu.Lock()
	n := len(a.lines)
	a.lines = append(a.lines, string(req.Request))
	a.mu.Unlock()
	reply, err := a.CallFn(n, string(req.Request))
	return agentapi.ProcessCallResult{Reply: json.RawMessage(reply)}, err
}

func agentErr(status int, code string) error {
	return &agentapi.Error{Status: status, Code: code, Message: code + " details"}
}

func newTestService(t *testing.T, ag *fakeAgent) (*Service, *fakeSandboxes) {
	t.Helper()
	reg, err := ParseRegistry([]byte(`envs: [{id: game, pool: py, command: [python3, game.py], defaults: {level: 1}, step_timeout_ms: 1500, lease_seconds: 60}]`))
	require.NoError(t, err)
	sb := &fakeSandboxes{Agent: ag}
	svc, err := New(reg, sb)
	require.NoError(t, err)
	return svc, sb
}

func TestService_Make_LabelsAndStartsTheProgram(t *testing.T) {
	ag := &fakeAgent{}
	svc, sb := newTestService(t, ag)
	id, err := svc.Make(context.Background(), "owner-1", "game", MakeOptions{Labels: map[string]string{"run": "7"}, IdempotencyKey: "k"})
	require.NoError(t, err)
	assert.Equal(t, "sbx-1", id)
	require.Len(t, sb.acquired, 1)
	assert.Equal(t, AcquireRequest{Pool: "py", Owner: "owner-1", LeaseSeconds: 60,
		Labels: map[string]string{"run": "7", LabelEnv: "game"}, IdempotencyKey: "k"}, sb.acquired[0])
	require.Len(t, ag.starts, 1)
	assert.Equal(t, agentapi.ProcessStartRequest{Argv: []string{"python3", "game.py"}, Name: ProcessName, RPC: true}, ag.starts[0])

	_, err = svc.Make(context.Background(), "owner-1", "game", MakeOptions{FromCheckpoint: "ckp-x"})
	require.NoError(t, err)
	require.Len(t, sb.acquired, 2)
	assert.Equal(t, "ckp-x", sb.acquired[1].FromCheckpoint, "the checkpoint goes to Acquire, which restores it before the program starts")

	_, err = svc.Make(context.Background(), "owner-1", "nope", MakeOptions{})
	var ve *badinput.Error
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "env_id", ve.Field)
}

func TestService_Make_ReplayedKeyOfAnotherEnvIsRefusedAndLeftAlone(t *testing.T) {
	ag := &fakeAgent{}
	svc, sb := newTestService(t, ag)
	sb.OpenFn = func(ctx context.Context, owner, id string) (Sandbox, error) {
		return Sandbox{Labels: map[string]string{LabelEnv: "other"}, Agent: ag}, nil
	}
	_, err := svc.Make(context.Background(), "owner-1", "game", MakeOptions{IdempotencyKey: "k"})
	var ve *badinput.Error
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "env_id", ve.Field)
	assert.Contains(t, ve.Message, `first used to make env "other"`)
	assert.Empty(t, sb.released, "the other env's sandbox is not released")
	assert.Empty(t, ag.starts, "nor is a program started in it")
}

func TestService_Make_StartFailures(t *testing.T) {
	tests := []struct {
		name     string
		startErr error
		released bool
		kind     Kind
	}{
		{name: "already running (replayed key)", startErr: agentErr(http.StatusConflict, agentapi.CodeNameInUse)},
		{name: "too many processes", startErr: agentErr(http.StatusConflict, agentapi.CodeConflict), released: true},
		{name: "program not found", startErr: agentErr(http.StatusBadRequest, agentapi.CodeBadRequest), released: true, kind: KindEnv},
		{name: "agent down", startErr: errors.New("connection refused"), released: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc, sb := newTestService(t, &fakeAgent{StartFn: func(agentapi.ProcessStartRequest) error { return tt.startErr }})
			id, err := svc.Make(context.Background(), "o", "game", MakeOptions{})
			if tt.released {
				require.Error(t, err)
				assert.Equal(t, []string{"sbx-1"}, sb.released)
				if tt.kind != "" {
					var ee *Error
					require.ErrorAs(t, err, &ee)
					assert.Equal(t, tt.kind, ee.Kind)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "sbx-1", id)
			assert.Empty(t, sb.released)
		})
	}
}

func TestService_Reset_StartsAFreshProgramWhenNoneRuns(t *testing.T) {
	for _, code := range []string{agentapi.CodeNotFound, agentapi.CodeProcessExited} {
		t.Run(code, func(t *testing.T) {
			ag := &fakeAgent{CallFn: func(n int, line string) (string, error) {
				if n == 0 {
					return "", agentErr(http.StatusConflict, code)
				}
				return `{"observation":"fresh"}`, nil
			}}
			svc, _ := newTestService(t, ag)
			res, err := svc.Reset(context.Background(), "o", "sbx-1", nil, nil)
			require.NoError(t, err)
			assert.JSONEq(t, `"fresh"`, string(res.Observation))
			assert.Len(t, ag.starts, 1)
			require.Len(t, ag.lines, 2)
			assert.Equal(t, `{"op":"reset","options":{"level":1}}`, ag.lines[1], "the env's defaults")
		})
	}
}

func TestService_CallErrors(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		kind   Kind
		passes bool // the agent's error comes through as is
	}{
		{name: "no program", err: agentErr(http.StatusNotFound, agentapi.CodeNotFound), kind: KindNotRunning},
		{name: "program had exited", err: agentErr(http.StatusConflict, agentapi.CodeProcessExited), kind: KindNotRunning},
		{name: "crashed during the step", err: agentErr(http.StatusConflict, agentapi.CodeNoReply), kind: KindEnv},
		{name: "malformed line", err: agentErr(http.StatusConflict, agentapi.CodeProtocolError), kind: KindEnv},
		{name: "timeout", err: agentErr(http.StatusGatewayTimeout, agentapi.CodeTimeout), kind: KindTimeout},
		{name: "busy", err: agentErr(http.StatusConflict, agentapi.CodeBusy), passes: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ag := &fakeAgent{CallFn: func(int, string) (string, error) { return "", tt.err }}
			svc, _ := newTestService(t, ag)
			_, err := svc.Step(context.Background(), "o", "sbx-1", json.RawMessage(`"a"`))
			require.Error(t, err)
			if tt.passes {
				assert.ErrorIs(t, err, tt.err)
				return
			}
			var ee *Error
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, tt.kind, ee.Kind)
			if tt.err.(*agentapi.Error).Code != agentapi.CodeNotFound {
				assert.Contains(t, ee.Message, "details", "the agent's message is kept")
			}
		})
	}
}

func TestService_NotAnEnvSandbox(t *testing.T) {
	for name, labels := range map[string]map[string]string{"no label": nil, "unknown env": {LabelEnv: "gone"}} {
		t.Run(name, func(t *testing.T) {
			svc, sb := newTestService(t, &fakeAgent{})
			sb.OpenFn = func(ctx context.Context, owner, id string) (Sandbox, error) {
				return Sandbox{Labels: labels, Agent: &fakeAgent{}}, nil
			}
			_, err := svc.Step(context.Background(), "o", "sbx-1", json.RawMessage(`1`))
			assert.ErrorIs(t, err, ErrNotEnv)
			_, err = svc.Reset(context.Background(), "o", "sbx-1", nil, nil)
			assert.ErrorIs(t, err, ErrNotEnv)
			assert.ErrorIs(t, svc.Close(context.Background(), "o", "sbx-1"), ErrNotEnv)
			assert.Empty(t, sb.released)
		})
	}
}

func TestService_Close_ReleasesEvenWhenTheProgramIsGone(t *testing.T) {
	ag := &fakeAgent{CallFn: func(int, string) (string, error) { return "", agentErr(http.StatusNotFound, agentapi.CodeNotFound) }}
	svc, sb := newTestService(t, ag)
	require.NoError(t, svc.Close(context.Background(), "o", "sbx-1"))
	assert.Equal(t, []string{"sbx-1"}, sb.released)
	assert.Equal(t, []string{`{"op":"close"}`}, ag.lines)
}
