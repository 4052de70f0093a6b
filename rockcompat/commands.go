package rockcompat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// agentDefaultTimeout is the exec agent's default command timeout, which
// applies when ROCK's timeout is None.
const agentDefaultTimeout = 300 * time.Second

// commandTimeout converts ROCK's timeout in seconds (nil or <= 0: the
// agent's default) to the agent's timeout_ms and the bound of the agent
// call.
func (s *Service) commandTimeout(secs *float64) (int64, time.Duration) {
	if secs == nil || *secs <= 0 {
		return 0, agentDefaultTimeout + s.cfg.TimeoutMargin
	}
	d := s.cfg.MaxCommandTimeout
	if *secs < d.Seconds() {
		d = time.Duration(*secs * float64(time.Second))
	}
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d.Milliseconds(), d + s.cfg.TimeoutMargin
}

// executeRequest is ROCK's SandboxCommand.
type executeRequest struct {
	SandboxID string            `json:"sandbox_id"`
	Command   json.RawMessage   `json:"command"`
	Timeout   *float64          `json:"timeout"`
	Env       map[string]string `json:"env"`
	Cwd       *string           `json:"cwd"`
}

// commandResult is ROCK's CommandResponse.
type commandResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode *int   `json:"exit_code"`
}

// execute serves execute: one command to completion, a string through the
// shell, a list as argv.
func (s *Service) execute(c *fiber.Ctx, owner string) (any, error) {
	var req executeRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	er := agentapi.ExecRequest{Env: req.Env}
	if req.Cwd != nil {
		er.Cwd = *req.Cwd
	}
	var str string
	var argv []string
	switch {
	case json.Unmarshal(req.Command, &str) == nil && strings.TrimSpace(str) != "":
		er.Command = str
	case json.Unmarshal(req.Command, &argv) == nil && len(argv) > 0:
		er.Argv = argv
	default:
		return nil, badinput.New("command", "must be a non-empty string or a non-empty list of strings")
	}
	ms, bound := s.commandTimeout(req.Timeout)
	er.TimeoutMS = ms
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout+bound)
	defer cancel()
	l, err := s.active(ctx, owner, req.SandboxID)
	if err != nil {
		return nil, err
	}
	res, err := s.agent(l).Exec(ctx, er)
	if err != nil {
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	if res.TimedOut {
		return nil, &errclass.CommandError{Message: fmt.Sprintf("command timed out after %d ms and was killed", ms)}
	}
	code := res.ExitCode
	return commandResult{Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: &code}, nil
}

// Sessions. A ROCK session is named per sandbox; its agent session id is
// kept in <StateDir>/<lease id>/sessions/<name> inside the sandbox, so any gateway
// replica finds it. The SDK's throw-away names ("bash-<nanoseconds>", made
// by arun without a session) get no agent session at all: their commands
// run as one-shot execs, so they cannot pile up in the agent.

var tempSession = regexp.MustCompile(`^bash-[0-9]+$`)

// checkSession accepts 1..128 letters, digits, '.', '_' and '-', not
// starting with '.'.
func checkSession(name string) error {
	if name == "" || len(name) > 128 || name[0] == '.' || !safePath(name) || strings.Contains(name, "/") {
		return badinput.New("session", "must be 1 to 128 letters, digits, '.', '_' or '-', not starting with '.', got %q", name)
	}
	return nil
}

// stateDir is the lease's directory of state files inside its sandbox: the
// lease id keeps sandboxes that share a file system (the process provider's
// host) apart.
func (s *Service) stateDir(l warmpool.Lease) string { return s.cfg.StateDir + "/" + l.ID }

func (s *Service) sessionFile(l warmpool.Lease, name string) string {
	return s.stateDir(l) + "/sessions/" + name
}

// forgetSession frees a ROCK session name (its agent session has ended or
// been closed). A file that is already gone is not an error.
func (s *Service) forgetSession(ctx context.Context, ac *agentapi.Client, l warmpool.Lease, name string) error {
	err := ac.DeleteFile(ctx, s.sessionFile(l, name))
	var ae *agentapi.Error
	if err != nil && !(errors.As(err, &ae) && ae.Status == http.StatusNotFound) {
		return fmt.Errorf("forget session %q: %w", name, err)
	}
	return nil
}

// sessionID returns the agent session of a ROCK session name ("" when there
// is none). The name's file is created exclusively by create_session and
// removed when the session ends, so a name maps to at most one session.
func (s *Service) sessionID(ctx context.Context, ac *agentapi.Client, l warmpool.Lease, name string) (string, error) {
	b, found, err := s.readSmall(ctx, ac, s.sessionFile(l, name))
	if err != nil || !found {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// sessionName returns the session a request names ("default" when none),
// validated.
func sessionName(p *string) (string, error) {
	name := "default"
	if p != nil {
		name = *p
	}
	return name, checkSession(name)
}

// openSession returns the active lease of sandboxID, its agent and the
// agent session of the ROCK session name ("" when there is none).
func (s *Service) openSession(ctx context.Context, owner, sandboxID, name string) (warmpool.Lease, *agentapi.Client, string, error) {
	l, err := s.active(ctx, owner, sandboxID)
	if err != nil {
		return l, nil, "", err
	}
	ac := s.agent(l)
	sid, err := s.sessionID(ctx, ac, l, name)
	if err != nil {
		return l, nil, "", errclass.Sandbox(sandboxID, err)
	}
	return l, ac, sid, nil
}

// readSmall reads a small state file in the sandbox; found is false when it
// does not exist.
func (s *Service) readSmall(ctx context.Context, ac *agentapi.Client, path string) ([]byte, bool, error) {
	rc, err := ac.ReadFile(ctx, path, 0, 0)
	var ae *agentapi.Error
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 4096))
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	return b, true, nil
}

// writeSmall replaces a small state file in the sandbox.
func (s *Service) writeSmall(ctx context.Context, ac *agentapi.Client, path, content string) error {
	if _, err := ac.WriteFile(ctx, path, 0o600, strings.NewReader(content)); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// createSessionRequest is ROCK's SandboxCreateBashSessionRequest.
type createSessionRequest struct {
	SandboxID     string            `json:"sandbox_id"`
	Session       *string           `json:"session"`
	StartupSource []string          `json:"startup_source"`
	Env           map[string]string `json:"env"`
	RemoteUser    *string           `json:"remote_user"`
}

// createSessionResult is ROCK's CreateBashSessionResponse.
type createSessionResult struct {
	Output      string `json:"output"`
	SessionType string `json:"session_type"`
}

// createSession serves create_session: a new bash session under a name
// that is not in use in the sandbox.
func (s *Service) createSession(c *fiber.Ctx, owner string) (any, error) {
	var req createSessionRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	name, err := sessionName(req.Session)
	if err != nil {
		return nil, err
	}
	if req.RemoteUser != nil && *req.RemoteUser != "" {
		return nil, badinput.New("remote_user", "is not supported: sessions run as the sandbox's user")
	}
	if tempSession.MatchString(name) && len(req.StartupSource) == 0 && len(req.Env) == 0 {
		return createSessionResult{SessionType: "bash"}, nil
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout+s.cfg.RequestTimeout)
	defer cancel()
	l, ac, old, err := s.openSession(ctx, owner, req.SandboxID, name)
	if err != nil {
		return nil, err
	}
	if old != "" {
		return nil, sessionExists(name, req.SandboxID)
	}
	info, err := ac.CreateSession(ctx, agentapi.SessionCreateRequest{Env: req.Env})
	if err != nil {
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	// Claim the name: of two create_session calls racing for it, one
	// creates the file and the other closes its new session again.
	if _, err := ac.CreateFile(ctx, s.sessionFile(l, name), 0o600, strings.NewReader(info.ID)); err != nil {
		_ = ac.CloseSession(context.WithoutCancel(ctx), info.ID)
		var ae *agentapi.Error
		if errors.As(err, &ae) && ae.Status == http.StatusConflict {
			return nil, sessionExists(name, req.SandboxID)
		}
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	var out strings.Builder
	for _, src := range req.StartupSource {
		res, err := ac.RunSession(ctx, info.ID, agentapi.SessionRunRequest{Command: ". " + shellQuote(src)})
		if err != nil {
			return nil, errclass.Sandbox(req.SandboxID, err)
		}
		out.WriteString(res.Output)
	}
	return createSessionResult{Output: strings.TrimSpace(out.String()), SessionType: "bash"}, nil
}

// sessionExists is create_session's answer for a name in use.
func sessionExists(name, sandboxID string) error {
	return badinput.New("session", "session %q already exists in sandbox %s; close it first", name, sandboxID)
}

// runRequest is ROCK's SandboxBashAction.
type runRequest struct {
	SandboxID            string   `json:"sandbox_id"`
	Session              *string  `json:"session"`
	Command              *string  `json:"command"`
	Timeout              *float64 `json:"timeout"`
	Check                *string  `json:"check"`
	IsInteractiveCommand bool     `json:"is_interactive_command"`
	IsInteractiveQuit    bool     `json:"is_interactive_quit"`
}

// observation is ROCK's BashObservation.
type observation struct {
	SessionType   string `json:"session_type"`
	Output        string `json:"output"`
	ExitCode      *int   `json:"exit_code"`
	FailureReason string `json:"failure_reason"`
	ExpectString  string `json:"expect_string"`
}

// runInSession serves run_in_session: one command in a named session, whose
// shell state persists. check "raise" (ROCK's default) answers a non-zero
// exit as Failed, "silent" returns it, "ignore" returns no exit code.
func (s *Service) runInSession(c *fiber.Ctx, owner string) (any, error) {
	var req runRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	name, err := sessionName(req.Session)
	if err != nil {
		return nil, err
	}
	if req.Command == nil {
		return nil, badinput.New("command", "is required")
	}
	check := "raise"
	if req.Check != nil {
		check = *req.Check
	}
	if check != "raise" && check != "silent" && check != "ignore" {
		return nil, badinput.New("check", "must be raise, silent or ignore, got %q", check)
	}
	if req.IsInteractiveCommand || req.IsInteractiveQuit {
		return nil, badinput.New("is_interactive_command", "interactive programs are not supported; use the process API")
	}
	ms, bound := s.commandTimeout(req.Timeout)
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout+s.cfg.RequestTimeout+bound)
	defer cancel()
	l, ac, sid, err := s.openSession(ctx, owner, req.SandboxID, name)
	if err != nil {
		return nil, err
	}
	if sid == "" && !tempSession.MatchString(name) {
		return nil, badinput.New("session", "session %q does not exist in sandbox %s; call create_session first", name, req.SandboxID)
	}
	cmd := *req.Command
	if pid := pollPid(cmd); pid != 0 && s.cfg.PollHold > 0 && !s.holdPoll(c, ctx, ac, l, pid) {
		return nil, errClientLeft
	}
	cmd = rewriteNohup(cmd, s.stateDir(l))
	rcFile, nohupOut := nohupRead(cmd, s.stateDir(l))
	nohupCode, haveCode := 0, false
	if rcFile != "" {
		if b, found, err := s.readSmall(ctx, ac, rcFile); err == nil && found && len(strings.TrimSpace(string(b))) > 0 {
			if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &nohupCode); err == nil {
				haveCode = true
			}
		}
	}

	var (
		output   string
		exitCode int
		timedOut bool
	)
	if sid == "" {
		res, err := ac.Exec(ctx, agentapi.ExecRequest{Command: "exec 2>&1\n" + cmd, TimeoutMS: ms})
		if err != nil {
			return nil, errclass.Sandbox(req.SandboxID, err)
		}
		output, exitCode, timedOut = res.Stdout, res.ExitCode, res.TimedOut
	} else {
		res, err := ac.RunSession(ctx, sid, agentapi.SessionRunRequest{Command: cmd, TimeoutMS: ms})
		var ae *agentapi.Error
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			_ = s.forgetSession(ctx, ac, l, name)
			return nil, badinput.New("session", "session %q of sandbox %s has ended (its shell exited); create it again", name, req.SandboxID)
		}
		if err != nil {
			return nil, errclass.Sandbox(req.SandboxID, err)
		}
		if res.Closed {
			_ = s.forgetSession(ctx, ac, l, name)
		}
		output, exitCode, timedOut = res.Output, res.ExitCode, res.TimedOut
	}
	output = strings.TrimSpace(output)
	if timedOut {
		return nil, &errclass.CommandError{Message: fmt.Sprintf("timeout after %g seconds while running command %q (the session is still usable)",
			float64(ms)/1000, *req.Command)}
	}
	obs := observation{SessionType: "bash", Output: output}
	if haveCode {
		_ = s.writeSmall(ctx, ac, rcFile, "")
		if nohupCode != 0 && s.cfg.NohupExit == NohupExitReal {
			reason := fmt.Sprintf("the nohup command writing %s exited with code %d", nohupOut, nohupCode)
			if check == "raise" {
				return nil, &errclass.CommandError{Message: fmt.Sprintf("%s. Here is its output:\n%s", reason, output)}
			}
			exitCode = nohupCode
			obs.FailureReason = reason
		}
	}
	if check == "ignore" {
		return obs, nil
	}
	if exitCode != 0 && check == "raise" {
		return nil, &errclass.CommandError{Message: fmt.Sprintf("Command %q failed with exit code %d. Here is the output:\n%s",
			*req.Command, exitCode, output)}
	}
	obs.ExitCode = &exitCode
	return obs, nil
}

// closeSessionRequest is ROCK's SandboxCloseBashSessionRequest.
type closeSessionRequest struct {
	SandboxID string  `json:"sandbox_id"`
	Session   *string `json:"session"`
}

// closeSession serves close_session: the session's shell is ended and its
// name can be used again.
func (s *Service) closeSession(c *fiber.Ctx, owner string) (any, error) {
	var req closeSessionRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	name, err := sessionName(req.Session)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout+s.cfg.RequestTimeout)
	defer cancel()
	l, ac, sid, err := s.openSession(ctx, owner, req.SandboxID, name)
	if err != nil {
		return nil, err
	}
	if sid == "" {
		if tempSession.MatchString(name) {
			return map[string]string{"session_type": "bash"}, nil
		}
		return nil, badinput.New("session", "session %q does not exist in sandbox %s", name, req.SandboxID)
	}
	var ae *agentapi.Error
	if err := ac.CloseSession(ctx, sid); err != nil && !(errors.As(err, &ae) && ae.Status == http.StatusNotFound) {
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	if err := s.forgetSession(ctx, ac, l, name); err != nil {
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	return map[string]string{"session_type": "bash"}, nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
