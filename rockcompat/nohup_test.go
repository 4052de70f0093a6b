package rockcompat

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sdkNohup is the start command of the SDK's nohup mode (rl-rock 1.11.0,
// Sandbox.start_nohup_process).
func sdkNohup(cmd, out string) string {
	return "nohup " + cmd + " < /dev/null > " + out + " 2>&1 & echo PIDSTART${!}PIDEND;disown"
}

func TestRewriteNohup_Shapes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cmd       string
		rewritten bool
	}{
		{name: "sdk start", cmd: sdkNohup("python train.py --x 1", "/tmp/tmp_1.out"), rewritten: true},
		{name: "multi-line command", cmd: sdkNohup("sh -c 'a\nb'", "/tmp/o.out"), rewritten: true},
		{name: "output path needing quotes", cmd: sdkNohup("true", "/tmp/a b.out")},
		{name: "plain command", cmd: "echo hi"},
		{name: "nohup of another shape", cmd: "nohup sleep 1 &"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rewriteNohup(tc.cmd, "/state")
			if !tc.rewritten {
				assert.Equal(t, tc.cmd, got)
				return
			}
			assert.NotEqual(t, tc.cmd, got)
			assert.Contains(t, got, "echo PIDSTART${!}PIDEND")
			assert.Contains(t, got, "/state/rc/")
		})
	}
}

func TestNohupRead_Shapes(t *testing.T) {
	for _, tc := range []struct {
		name, cmd, out string
	}{
		{name: "cat", cmd: "cat /tmp/tmp_1.out", out: "/tmp/tmp_1.out"},
		{name: "head", cmd: "head -c 1024 /tmp/x.out", out: "/tmp/x.out"},
		{name: "cat of two files", cmd: "cat /a /b"},
		{name: "other", cmd: "tail /tmp/x.out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, out := nohupRead(tc.cmd, "/state")
			assert.Equal(t, tc.out, out)
			if tc.out == "" {
				assert.Empty(t, rc)
				return
			}
			assert.Equal(t, rcFile("/state", tc.out), rc)
		})
	}
}

var pidPattern = regexp.MustCompile(`PIDSTART([0-9]+)PIDEND`)

// The rewritten start command keeps the SDK's contract (it prints the PID of
// a process that lives until the command ends, the output goes to the file)
// and records the exit status, in a real bash and a POSIX sh, with no nohup
// program on the PATH.
func TestRewriteNohup_RealShellsKeepExitCode(t *testing.T) {
	bin := t.TempDir() // what the rewrite and the commands use, but no nohup
	for _, prog := range []string{"sh", "sleep", "mkdir", "rm"} {
		p, err := exec.LookPath(prog)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(p, filepath.Join(bin, prog)))
	}
	for _, tc := range []struct {
		name   string
		cmd    string
		output string
		code   string
	}{
		{name: "success", cmd: "sh -c 'echo done; sleep 0.2'", output: "done\n", code: "0"},
		{name: "failure", cmd: "sh -c 'echo failing >&2; exit 3'", output: "failing\n", code: "3"},
		{name: "command not found", cmd: "no-such-command-xyz", code: "127"},
		{name: "hangup ignored", cmd: "sh -c 'kill -HUP $$; echo survived'", output: "survived\n", code: "0"},
		{name: "assignment before the command", cmd: "GREETING=hi sh -c 'echo $GREETING'", output: "hi\n", code: "0"},
		{name: "a list ending in exit", cmd: "echo bad; exit 7", output: "bad\n", code: "7"},
		{name: "a trailing comment", cmd: "echo hi # note", output: "hi\n", code: "0"},
	} {
		for _, shell := range []string{"bash", "sh"} {
			t.Run(tc.name+"/"+shell, func(t *testing.T) {
				dir := t.TempDir()
				out := filepath.Join(dir, "job.out")
				state := filepath.Join(dir, "state")
				sh, err := exec.LookPath(shell)
				require.NoError(t, err)
				cmd := exec.Command(sh, "-c", rewriteNohup(sdkNohup(tc.cmd, out), state))
				cmd.Env = []string{"PATH=" + bin}
				res, err := cmd.CombinedOutput()
				require.NoError(t, err, string(res))
				m := pidPattern.FindStringSubmatch(string(res))
				require.NotNil(t, m, "no PID in %q", res)
				pid, err := strconv.Atoi(m[1])
				require.NoError(t, err)
				rc := rcFile(state, out)
				deadline := time.Now().Add(30 * time.Second)
				for running(pid) || !fileExists(rc) {
					require.True(t, time.Now().Before(deadline), "the job did not end")
					time.Sleep(20 * time.Millisecond)
				}
				code, err := os.ReadFile(rc)
				require.NoError(t, err)
				assert.Equal(t, tc.code, strings.TrimSpace(string(code)))
				if tc.output != "" {
					got, err := os.ReadFile(out)
					require.NoError(t, err)
					assert.Equal(t, tc.output, string(got))
				}
			})
		}
	}
}

// running reports whether pid is alive and not a zombie (the orphaned job
// is reaped by the machine's init, which may take seconds).
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func TestPollPid_OnlyTheSDKsCheck(t *testing.T) {
	for _, tc := range []struct {
		cmd string
		pid int
	}{
		{cmd: "kill -0 1234", pid: 1234},
		{cmd: "kill -0 4194304", pid: 4194304},
		{cmd: "kill -0 4194305"}, // above Linux's largest pid
		{cmd: "kill -0 0"},
		{cmd: "kill -0 -1"},
		{cmd: "kill -0 12 34"},
		{cmd: "kill -0 1234; echo x"},
		{cmd: " kill -0 1234"},
		{cmd: "kill -9 1234"},
		{cmd: "kill -0 01234"},
	} {
		assert.Equal(t, tc.pid, pollPid(tc.cmd), tc.cmd)
	}
}

// The rewritten start marks the job's pid right after starting it, where
// the agent looks for it (jobMarker).
func TestRewriteNohup_MarksTheJob(t *testing.T) {
	got := rewriteNohup(sdkNohup("python x.py", "/tmp/o.out"), "/state")
	assert.Contains(t, got, "mkdir -p /state/rc /state/jobs;")
	assert.Contains(t, got, "&\n: > /state/jobs/$! 2> /dev/null; echo PIDSTART${!}PIDEND")
	assert.Equal(t, "/state/jobs/42", jobMarker("/state", 42))
}

func TestPollHoldSetting_Decode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{in: "8s", want: 8 * time.Second},
		{in: "250ms", want: 250 * time.Millisecond},
		{in: "off", want: PollHoldOff},
		{in: "0", want: PollHoldOff},
		{in: "0s", want: PollHoldOff},
		{in: "1m", want: time.Minute},
		{in: "61s", err: true},
		{in: "-1s", err: true},
		{in: "soon", err: true},
	} {
		var h PollHoldSetting
		err := h.Decode(tc.in)
		if tc.err {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, time.Duration(h), tc.in)
	}
	cfg := Config{PollHold: 2 * time.Minute}
	assert.ErrorContains(t, cfg.Validate(), "PollHold")
	assert.Equal(t, DefaultPollHold, Config{}.WithDefaults().PollHold)
	assert.Equal(t, PollHoldOff, Config{PollHold: PollHoldOff}.WithDefaults().PollHold)
}

func TestConfig_NohupExit(t *testing.T) {
	assert.Equal(t, NohupExitROCK, Config{}.WithDefaults().NohupExit, "ROCK's answer by default: its own classes rely on it")
	assert.NoError(t, Config{NohupExit: NohupExitReal}.WithDefaults().Validate())
	assert.ErrorContains(t, Config{NohupExit: "true"}.WithDefaults().Validate(), "QUARRY_ROCK_NOHUP_EXIT")
}
