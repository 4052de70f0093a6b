package process

import (
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/providertest"
)

func TestProvider_Conformance(t *testing.T) {
	bin := providertest.BuildAgent(t)
	root := t.TempDir()
	providertest.Run(t, providertest.Harness{
		Open: func(t *testing.T) func(t *testing.T) providers.Provider {
			dir, err := os.MkdirTemp(root, "state-")
			require.NoError(t, err)
			return func(t *testing.T) providers.Provider { return newProvider(t, dir, bin) }
		},
		Spec:    providers.Spec{Image: "host", Env: map[string]string{"QUARRY_TEST": "1"}},
		BadSpec: providers.Spec{Image: "ubuntu:24.04"},
		KillTask: func(t *testing.T, task providers.Task) {
			matches, err := filepath.Glob(filepath.Join(root, "state-*", task.Name, recordFile))
			require.NoError(t, err)
			require.Len(t, matches, 1, "record of %s", task.Name)
			rec, err := readRecord(filepath.Dir(matches[0]))
			require.NoError(t, err)
			killGroup(t, rec.PID)
		},
	})
}

func TestProvider_Launch_WritesPrivateRecord(t *testing.T) {
	p := newProvider(t, t.TempDir(), writeScript(t, "agent", scriptSleeper))
	task := launchOne(t, p, "pool-a", "t1")

	assert.Equal(t, "t1", task.ID)
	assert.Equal(t, providers.TaskRunning, task.State)
	assert.Equal(t, "http://127.0.0.1:9", task.AgentURL)
	assert.Len(t, task.AgentToken, 2*tokenBytes)
	assert.Equal(t, map[string]string{
		providers.LabelManaged: "true",
		providers.LabelPool:    "pool-a",
		providers.LabelTask:    "t1",
		providers.LabelGateway: "test-gateway",
	}, task.Labels)

	rec := mustRecord(t, p, "t1")
	assert.Equal(t, task.AgentToken, rec.Token)
	assert.Equal(t, task.AgentURL, rec.AgentURL)
	assert.Equal(t, p.bootID, rec.BootID)
	assert.Equal(t, procOf(t, rec.PID).start, rec.StartTime)
	st, err := readStat(rec.PID)
	require.NoError(t, err)
	assert.Equal(t, rec.PID, st.Session, "the agent leads its own session")
	onDisk := recordJSON(t, p, "t1")
	for _, key := range []string{"name", "pool", "pid", "start_time", "boot_id", "agent_url", "token", "labels", "created_at"} {
		assert.Contains(t, onDisk, key)
	}

	tests := []struct {
		name string
		path string
		mode fs.FileMode
	}{
		{name: "task dir", path: p.taskDir("t1"), mode: fs.ModeDir | 0o700},
		{name: "work dir", path: filepath.Join(p.taskDir("t1"), workDir), mode: fs.ModeDir | 0o700},
		{name: "record", path: filepath.Join(p.taskDir("t1"), recordFile), mode: 0o600},
		{name: "log", path: filepath.Join(p.taskDir("t1"), logFile), mode: 0o600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fi, err := os.Stat(tt.path)
			require.NoError(t, err)
			assert.Equal(t, tt.mode, fi.Mode())
		})
	}
}

func TestProvider_Launch_InvalidNamesLaunchNothing(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptSleeper))
	tests := []struct {
		name  string
		names []string
		want  string
	}{
		{name: "escape", names: []string{"ok", "../evil"}, want: `names[1] "../evil"`},
		{name: "empty", names: []string{""}, want: `names[0] ""`},
		{name: "slash", names: []string{"a/b"}, want: `names[0] "a/b"`},
		{name: "repeated", names: []string{"x", "x"}, want: `names[1] "x": repeated`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tasks, err := p.Launch(context.Background(), spec("p"), tt.names)
			stopAtEnd(t, p, tasks...)
			assert.Empty(t, tasks)
			var lerr *providers.LaunchError
			require.ErrorAs(t, err, &lerr)
			assert.ErrorIs(t, err, providers.ErrInvalidSpec)
			assert.Contains(t, lerr.Reason, tt.want)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, entries)
		})
	}
}

func TestProvider_Launch_ImageOtherThanHostIsRefused(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptSleeper))
	s := spec("p")
	s.Image = "python:3.12"
	tasks, err := p.Launch(context.Background(), s, []string{"t1"})
	assert.Empty(t, tasks)
	var lerr *providers.LaunchError
	require.ErrorAs(t, err, &lerr)
	assert.ErrorIs(t, err, providers.ErrInvalidSpec)
	assert.Contains(t, err.Error(), `"python:3.12"`)
	assert.False(t, dirExists(t, filepath.Join(dir, "t1")))
}

func TestProvider_Launch_PartialFailureReturnsTheOthers(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptSleeper))
	// Another task already owns "t2"; its directory must stay untouched.
	require.NoError(t, os.Mkdir(filepath.Join(dir, "t2"), 0o700))
	marker := filepath.Join(dir, "t2", "marker")
	require.NoError(t, os.WriteFile(marker, []byte("mine"), 0o600))

	tasks, err := p.Launch(context.Background(), spec("p"), []string{"t1", "t2", "t3"})
	stopAtEnd(t, p, tasks...)
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrExist)
	assert.Contains(t, err.Error(), `launch task "t2"`)
	assert.Contains(t, err.Error(), "launch 1 of 3 tasks")
	require.Len(t, tasks, 2)
	assert.Equal(t, "t1", tasks[0].Name)
	assert.Equal(t, "t3", tasks[1].Name)
	b, err := os.ReadFile(marker)
	require.NoError(t, err)
	assert.Equal(t, "mine", string(b))
}

func TestProvider_Launch_AgentExitingEarlyFailsAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", `echo "boom: bad config" >&2; exit 3`))
	tasks, err := p.Launch(context.Background(), spec("p"), []string{"t1"})
	assert.Empty(t, tasks)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exit status 3")
	assert.Contains(t, err.Error(), "boom: bad config", "the error quotes the agent's log")
	assert.False(t, dirExists(t, filepath.Join(dir, "t1")))
}

func TestProvider_Launch_StartTimeoutKillsTheAgent(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", `exec sleep 600`),
		func(c *Config) { c.StartTimeout = 300 * time.Millisecond })
	s := spec("p")
	marker := "QUARRY_TEST_MARKER=" + strconv.FormatInt(time.Now().UnixNano(), 36)
	k, v, _ := strings.Cut(marker, "=")
	s.Env[k] = v

	tasks, err := p.Launch(context.Background(), s, []string{"t1"})
	assert.Empty(t, tasks)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "start timeout")
	assert.False(t, dirExists(t, filepath.Join(dir, "t1")))
	assert.Empty(t, processesWithEnv(t, marker), "the agent was killed")
}

func TestProvider_Launch_CanceledContextLaunchesNothing(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptSleeper))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tasks, err := p.Launch(ctx, spec("p"), []string{"t1", "t2"})
	assert.Empty(t, tasks)
	assert.ErrorIs(t, err, context.Canceled)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

func TestProvider_Launch_AfterCloseFails(t *testing.T) {
	p := newProvider(t, t.TempDir(), writeScript(t, "agent", scriptSleeper))
	require.NoError(t, p.Close(context.Background()))
	require.NoError(t, p.Close(context.Background()), "close is idempotent")
	_, err := p.Launch(context.Background(), spec("p"), []string{"t1"})
	assert.ErrorContains(t, err, "provider closed")
}

func TestProvider_Stop_EscalatesToSIGKILLAfterGrace(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptTermIgnorer),
		func(c *Config) { c.StopGrace = 200 * time.Millisecond })
	launchOne(t, p, "p", "t1")
	agent := procOf(t, mustRecord(t, p, "t1").PID)

	require.NoError(t, p.Stop(context.Background(), "t1", "test"))
	assert.False(t, agent.exists(), "the agent was killed and reaped")
	assert.False(t, dirExists(t, filepath.Join(dir, "t1")))
}

func TestProvider_Stop_KillsOrphansOfADeadAgent(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptWithGrandchild))
	launchOne(t, p, "p", "t1")
	rec := mustRecord(t, p, "t1")
	grandchild := procOf(t, readPIDFile(t, filepath.Join(p.taskDir("t1"), workDir, "gc.pid")))

	killGroup(t, rec.PID) // the agent's group only: the grandchild has its own
	eventually(t, "t1 stopped", func() bool {
		got, err := p.Describe(context.Background(), []string{"t1"})
		return err == nil && got[0].State == providers.TaskStopped
	})
	require.True(t, grandchild.alive(), "the orphan outlives its agent")

	require.NoError(t, p.Stop(context.Background(), "t1", "test"))
	eventually(t, "orphan killed", func() bool { return !grandchild.alive() })
	assert.False(t, dirExists(t, filepath.Join(dir, "t1")))
}

// A gateway that dies between starting an agent and recording its pid leaves
// a record without one; Stop still finds that agent (by its environment) and
// kills its session.
func TestProvider_Stop_FindsAgentWhosePidWasNeverRecorded(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, providertest.BuildAgent(t))
	launchOne(t, p, "p", "t1")
	rec := mustRecord(t, p, "t1")
	agent := procOf(t, rec.PID)
	rec.PID, rec.StartTime, rec.AgentURL = 0, 0, ""
	require.NoError(t, writeRecord(p.taskDir("t1"), rec))

	require.NoError(t, p.Stop(context.Background(), "t1", "test"))
	eventually(t, "unrecorded agent killed", func() bool { return !agent.alive() })
	assert.False(t, dirExists(t, filepath.Join(dir, "t1")))
}

func TestProvider_Stop_RemovesReadOnlyDirectories(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptSleeper))
	launchOne(t, p, "p", "t1")
	work := filepath.Join(p.taskDir("t1"), workDir)
	// What a sandbox command may leave behind: read-only and unreadable
	// directories, and a symlink out of the sandbox (not to be followed).
	outside := filepath.Join(t.TempDir(), "outside")
	require.NoError(t, os.Mkdir(outside, 0o700))
	require.NoError(t, os.MkdirAll(filepath.Join(work, "ro", "sub"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(work, "ro", "sub", "f"), []byte("x"), 0o400))
	require.NoError(t, os.Symlink(outside, filepath.Join(work, "ro", "link")))
	require.NoError(t, os.Chmod(filepath.Join(work, "ro", "sub"), 0o500))
	require.NoError(t, os.Chmod(filepath.Join(work, "ro"), 0o500))
	require.NoError(t, os.Mkdir(filepath.Join(work, "locked"), 0o700))
	require.NoError(t, os.Chmod(filepath.Join(work, "locked"), 0o000))

	require.NoError(t, p.Stop(context.Background(), "t1", "test"))
	assert.False(t, dirExists(t, p.taskDir("t1")))
	fi, err := os.Stat(outside)
	require.NoError(t, err, "the symlink target survives")
	assert.Equal(t, fs.FileMode(0o700), fi.Mode().Perm())
}

func TestProvider_Stop_ConcurrentCallsAllSucceed(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, writeScript(t, "agent", scriptSleeper))
	other := newProvider(t, dir, "/bin/true")
	launchOne(t, p, "p", "t1")
	agent := procOf(t, mustRecord(t, p, "t1").PID)

	errs := make([]error, 6)
	var wg sync.WaitGroup
	for i := range errs {
		inst := p
		if i%2 == 1 {
			inst = other
		}
		wg.Go(func() { errs[i] = inst.Stop(context.Background(), "t1", "test") })
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "stop %d", i)
	}
	eventually(t, "agent gone", func() bool { return !agent.alive() })
	assert.False(t, dirExists(t, p.taskDir("t1")))
}

func TestProvider_Stop_RecordWithoutProcessRemovesDirectory(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, "/bin/true")
	tests := []struct {
		name   string
		record string
	}{
		{name: "unreadable record", record: "{not json"},
		{name: "no record", record: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			taskDir := filepath.Join(dir, "t1")
			require.NoError(t, os.MkdirAll(filepath.Join(taskDir, workDir), 0o700))
			if tt.record != "" {
				require.NoError(t, os.WriteFile(filepath.Join(taskDir, recordFile), []byte(tt.record), 0o600))
			}
			require.NoError(t, p.Stop(context.Background(), "t1", "test"))
			assert.False(t, dirExists(t, taskDir))
		})
	}
}

func TestProvider_Describe_StateFromRecordAndProc(t *testing.T) {
	// Records pointing at this test process (alive, with a known start
	// time); nothing here is ever stopped.
	p := newProvider(t, t.TempDir(), "/bin/true")
	self := procOf(t, os.Getpid())
	now := time.Now().UTC()
	live := record{Version: recordVersion, Pool: "p", PID: self.pid, StartTime: self.start, BootID: p.bootID,
		AgentURL: "http://127.0.0.1:9", Token: "tok", CreatedAt: now}
	tests := []struct {
		name       string
		modify     func(*record)
		addr       string
		wantState  providers.TaskState
		wantReason string
		wantURL    string
	}{
		{name: "running", wantState: providers.TaskRunning, wantURL: "http://127.0.0.1:9"},
		{name: "address only in the addr file", modify: func(r *record) { r.AgentURL = "" }, addr: "127.0.0.1:4242\n",
			wantState: providers.TaskRunning, wantURL: "http://127.0.0.1:4242"},
		{name: "not bound yet", modify: func(r *record) { r.AgentURL = "" }, wantState: providers.TaskPending},
		{name: "non-loopback address is ignored", modify: func(r *record) { r.AgentURL = "" }, addr: "10.0.0.1:80",
			wantState: providers.TaskPending},
		{name: "not started, launch may be under way", modify: func(r *record) { r.PID, r.StartTime = 0, 0 },
			wantState: providers.TaskPending},
		{name: "not started long ago", modify: func(r *record) { r.PID, r.CreatedAt = 0, now.Add(-time.Hour) },
			wantState: providers.TaskStopped, wantReason: reasonIncomplete},
		{name: "pid reused", modify: func(r *record) { r.StartTime++ },
			wantState: providers.TaskStopped, wantReason: reasonExited},
		{name: "earlier boot", modify: func(r *record) { r.BootID = "another-boot" },
			wantState: providers.TaskStopped, wantReason: reasonExited},
		{name: "no such process", modify: func(r *record) { r.PID = 1 << 30 },
			wantState: providers.TaskStopped, wantReason: reasonExited},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := live
			rec.Name = "t" + strconv.Itoa(i)
			if tt.modify != nil {
				tt.modify(&rec)
			}
			taskDir := p.taskDir(rec.Name)
			require.NoError(t, os.Mkdir(taskDir, 0o700))
			require.NoError(t, writeRecord(taskDir, &rec))
			if tt.addr != "" {
				require.NoError(t, os.WriteFile(filepath.Join(taskDir, addrFile), []byte(tt.addr), 0o600))
			}
			got, err := p.Describe(context.Background(), []string{rec.Name})
			require.NoError(t, err)
			require.Len(t, got, 1)
			assert.Equal(t, tt.wantState, got[0].State)
			assert.Equal(t, tt.wantReason, got[0].Reason)
			assert.Equal(t, tt.wantURL, got[0].AgentURL)
			assert.Equal(t, "tok", got[0].AgentToken)
		})
	}
}

func TestProvider_Describe_UnreadableRecordIsStopped(t *testing.T) {
	dir := t.TempDir()
	p := newProvider(t, dir, "/bin/true")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "t1"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "t1", recordFile), []byte("{"), 0o600))

	got, err := p.Describe(context.Background(), []string{"t1", "../etc"})
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, providers.TaskStopped, got[0].State)
	assert.Contains(t, got[0].Reason, "unreadable task record")
	assert.Equal(t, providers.TaskStopped, got[1].State)
	assert.Equal(t, reasonNotFound, got[1].Reason)

	all, err := p.List(context.Background(), "")
	require.NoError(t, err)
	require.Len(t, all, 1, "List(\"\") shows it so it can be stopped")
	assert.Equal(t, "t1", all[0].Name)
	inPool, err := p.List(context.Background(), "p")
	require.NoError(t, err)
	assert.Empty(t, inPool)
}

func TestProvider_ReapsItsAgents(t *testing.T) {
	p := newProvider(t, t.TempDir(), writeScript(t, "agent", scriptSleeper))
	launchOne(t, p, "p", "t1")
	agent := procOf(t, mustRecord(t, p, "t1").PID)
	killGroup(t, agent.pid)
	// No Describe or Stop: the reaper alone must collect the zombie.
	eventually(t, "agent reaped", func() bool { return !agent.exists() })
}

func TestProvider_TasksSurviveANewProvider(t *testing.T) {
	dir := t.TempDir()
	agent := writeScript(t, "agent", scriptSleeper)
	first := newProvider(t, dir, agent)
	launched := launchOne(t, first, "p", "t1")
	require.NoError(t, first.Close(context.Background()))

	second := newProvider(t, dir, agent)
	got, err := second.Describe(context.Background(), []string{"t1"})
	require.NoError(t, err)
	assert.Equal(t, providers.TaskRunning, got[0].State)
	assert.Equal(t, launched.AgentToken, got[0].AgentToken)
	pid := mustRecord(t, second, "t1").PID
	agentProc := procOf(t, pid)
	require.NoError(t, second.Stop(context.Background(), "t1", "test"))
	eventually(t, "agent gone", func() bool { return !agentProc.alive() })
}

// The tests below talk to the real exec agent.

func TestProvider_Stop_KillsSandboxGrandchildren(t *testing.T) {
	p, _, client := launchRealAgent(t)

	var info agentapi.ProcessInfo
	err := client.Do(context.Background(), http.MethodPost, agentapi.RouteProcesses, agentapi.ProcessStartRequest{
		Command: `set -m; (trap '' TERM; exec sleep 600) & echo $! > "$HOME/gc.pid"; wait`,
	}, &info)
	require.NoError(t, err)
	grandchild := procOf(t, readPIDFile(t, filepath.Join(p.taskDir("t1"), workDir, "gc.pid")))

	require.NoError(t, p.Stop(context.Background(), "t1", "test"))
	eventually(t, "grandchild killed", func() bool { return !grandchild.alive() })
}

func TestProvider_TokenIsNotInSandboxEnv(t *testing.T) {
	p, task, client := launchRealAgent(t)

	var res agentapi.ExecResult
	err := client.Do(context.Background(), http.MethodPost, agentapi.RouteExec,
		agentapi.ExecRequest{Command: "env; pwd"}, &res)
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	assert.NotContains(t, res.Stdout, task.AgentToken)
	assert.NotContains(t, res.Stdout, "QUARRY_AGENT_TOKEN")
	work := filepath.Join(p.taskDir("t1"), workDir)
	assert.Contains(t, res.Stdout, "HOME="+work+"\n")
	assert.Contains(t, res.Stdout, "QUARRY_TEST=1\n", "the spec's env reaches commands")
	assert.Contains(t, res.Stdout, "\n"+work+"\n", "commands start in the workdir")
}

// launchRealAgent launches task "t1" running the real agent and waits until
// the agent answers /healthz.
func launchRealAgent(t testing.TB) (*Provider, providers.Task, *agentapi.Client) {
	t.Helper()
	p := newProvider(t, t.TempDir(), providertest.BuildAgent(t))
	task := launchOne(t, p, "p", "t1")
	client := agentapi.New(task.AgentURL, task.AgentToken, &http.Client{Timeout: 30 * time.Second})
	eventually(t, "agent healthy", func() bool {
		_, err := client.Health(context.Background())
		return err == nil
	})
	return p, task, client
}

// recordJSON is used by tests that want to see the file as JSON.
func recordJSON(t testing.TB, p *Provider, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.taskDir(name), recordFile))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// An agent whose task directory is gone (its gateway's data dir was
// removed: a test's temp dir, say) exits and takes its sandbox's processes
// with it: no Provider will ever find it again to stop it.
func TestProvider_AgentExitsWhenItsTaskDirIsGone(t *testing.T) {
	p, _, client := launchRealAgent(t)
	agent := procOf(t, mustRecord(t, p, "t1").PID)
	// Without its record, Stop cannot find an agent that failed to exit.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		var s sessionScanner
		_ = s.kill(ctx, agent.pid)
	})
	var info agentapi.ProcessInfo
	err := client.Do(context.Background(), http.MethodPost, agentapi.RouteProcesses, agentapi.ProcessStartRequest{Command: "sleep 600"}, &info)
	require.NoError(t, err)
	child := procOf(t, info.PID)

	require.NoError(t, os.RemoveAll(p.taskDir("t1")))
	// The agent checks every 5 s (execagent's default OwnerCheckInterval).
	removed := time.Now()
	for agent.alive() || child.alive() {
		require.Less(t, time.Since(removed), 15*time.Second, "agent alive %v, its child alive %v after the task directory went", agent.alive(), child.alive())
		time.Sleep(pollInterval)
	}
}

// A task whose agent died says how, and how the agent's log ends.
func TestProvider_Describe_ReasonCarriesTheAgentsLogTail(t *testing.T) {
	p, task, _ := launchRealAgent(t)
	killGroup(t, mustRecord(t, p, task.Name).PID)
	var got []providers.Task
	eventually(t, "the task stops", func() bool {
		var err error
		got, err = p.Describe(context.Background(), []string{task.ID})
		return err == nil && got[0].State == providers.TaskStopped
	})
	assert.Contains(t, got[0].Reason, reasonExited+" (killed by SIGKILL)")
	assert.Contains(t, got[0].Reason, "; its log ends: ")
	assert.Contains(t, got[0].Reason, "exec agent listening", "the agent's own log line")
}
