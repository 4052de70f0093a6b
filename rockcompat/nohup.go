package rockcompat

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
	"sync/atomic"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// The SDK's nohup mode (arun(..., mode="nohup")) starts
//
//	nohup CMD < /dev/null > FILE 2>&1 & echo PIDSTART${!}PIDEND;disown
//
// in a session, polls "kill -0 PID" until it fails, then reads FILE with
// "cat FILE" (or "head -c N FILE"), and reports exit code 0 whatever CMD
// returned (ROCK issue #685). Quarry runs the start command so that the
// backgrounded job also writes CMD's exit status to a file in the sandbox
// (<StateDir>/<lease id>/rc/<hash of FILE>), with the same PID semantics (the PID is
// alive exactly until CMD has ended). When the SDK then reads FILE, Quarry
// reads that status once. With Config.NohupExit "real", a non-zero status
// makes the read fail (check "raise", the SDK's default), so the SDK's
// Observation has exit_code 1 and its failure_reason and output name the
// real exit code and carry the command's output; with check "silent" the
// read answers the real exit code itself. By default ("rock") the read
// answers success, as ROCK does. Commands that do not have the SDK's exact
// shape run unchanged.
//
// The job ignores SIGHUP with the shell's own "trap '' HUP" (an ignored
// signal stays ignored across exec) instead of running the nohup program,
// which many images lack (Debian's busybox has no nohup applet). CMD runs
// in a subshell of its own, so that a list ("make; exit 3", which the SDK
// passes unquoted) has all its output in FILE and its last status in the
// status file, where ROCK would run only the first command in the background.

var (
	nohupStart = regexp.MustCompile(`(?s)^nohup (.+) < /dev/null > ([A-Za-z0-9_./-]+) 2>&1 & echo PIDSTART\$\{!\}PIDEND;disown$`)
	nohupCat   = regexp.MustCompile(`^(?:cat|head -c [0-9]+) ([A-Za-z0-9_./-]+)$`)
)

// rcFile is where the exit status of the nohup command writing out is kept.
func rcFile(stateDir, out string) string {
	sum := sha256.Sum256([]byte(out))
	return stateDir + "/rc/" + hex.EncodeToString(sum[:12])
}

// rewriteNohup returns cmd, rewritten when it is the SDK's nohup start
// command so that the job's exit status is kept and its PID is marked as
// a nohup job's (jobMarker), for the polls of pollHeld.
func rewriteNohup(cmd, stateDir string) string {
	m := nohupStart.FindStringSubmatch(cmd)
	if m == nil {
		return cmd
	}
	body, out := m[1], m[2]
	rc := rcFile(stateDir, out)
	return "mkdir -p " + stateDir + "/rc " + stateDir + "/jobs; rm -f " + rc + "\n" +
		"( trap '' HUP; ( " + body + "\n) < /dev/null > " + out + " 2>&1; echo $? > " + rc + " ) > /dev/null 2>&1 &\n" +
		": > " + stateDir + "/jobs/$! 2> /dev/null; echo PIDSTART${!}PIDEND; disown 2> /dev/null || :"
}

// jobMarker is the file the rewritten start command leaves for the nohup
// job of PID pid: the agent holds a poll of that PID only when it exists
// (and is younger than the process), so that "kill -0" of any other
// process is answered at once.
func jobMarker(stateDir string, pid int) string {
	return stateDir + "/jobs/" + strconv.Itoa(pid)
}

// The SDK waits for a nohup job (Sandbox.wait_for_process_completion) by
// running "kill -0 PID" in the job's session, then sleeping
// max(5, wait_interval) seconds, until the check fails, which it reads as
// the job's end; each check may take min(2 × interval, wait_timeout)
// seconds before the SDK counts it as timed out. Quarry holds such a check
// of a job it started (pollHeld) until the job is gone or PollHold has
// passed, and only then runs the check itself: its answer is the truth at
// that moment, and a job that ends within the hold is seen to end at once
// rather than at the next poll, five seconds or more later. The hold (8 s
// by default) is below the shortest check timeout of a wait_timeout of 10
// s or more (10 s), so a check never times out because of it; a shorter
// wait_timeout makes the SDK give up its check before the hold ends, and
// the gateway stops holding when the SDK's connection closes
// (docs/ROCK.md, "Nohup jobs without the five-second polls").
var killZero = regexp.MustCompile(`^kill -0 ([1-9][0-9]{0,9})$`)

// pollPid returns the PID that cmd checks when it is exactly the SDK's
// "kill -0 PID" (0 otherwise).
func pollPid(cmd string) int {
	m := killZero.FindStringSubmatch(cmd)
	if m == nil {
		return 0
	}
	pid, err := strconv.Atoi(m[1])
	if err != nil || pid > maxPid {
		return 0
	}
	return pid
}

// errClientLeft answers a held check whose client has gone (nobody reads
// it; a command failure is not logged as the service's).
var errClientLeft error = &errclass.CommandError{Message: "the client closed its connection before the check ran"}

// maxPid is Linux's largest PID (PID_MAX_LIMIT on 64-bit systems).
const maxPid = 1 << 22

// holdPoll holds c's "kill -0 pid" until the job of that PID is gone, the
// service's PollHold passes, or c's client leaves (false: the caller
// answers nothing more). A failed wait is not the caller's failure: the
// check then runs at once, as without a hold.
func (s *Service) holdPoll(c *fiber.Ctx, ctx context.Context, ac *agentapi.Client, l warmpool.Lease, pid int) bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PollHold+s.cfg.ManagerTimeout)
	defer cancel()
	var left atomic.Bool
	stop := s.leave(c, func() { left.Store(true); cancel() })
	_, err := ac.WaitPid(ctx, pid, agentapi.PidWaitRequest{
		TimeoutMS: s.cfg.PollHold.Milliseconds(), Marker: jobMarker(s.stateDir(l), pid)})
	stop()
	if left.Load() {
		return false
	}
	if err != nil {
		s.log.Debug("hold kill -0 poll", "sandbox", l.ID, "pid", pid, "err", err)
	}
	return true
}

// nohupRead returns the status file and output file of cmd when it is the
// SDK's read of a nohup output ("" otherwise).
func nohupRead(cmd, stateDir string) (rc, out string) {
	m := nohupCat.FindStringSubmatch(cmd)
	if m == nil {
		return "", ""
	}
	return rcFile(stateDir, m[1]), m[1]
}
