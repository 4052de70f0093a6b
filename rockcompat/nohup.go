package rockcompat

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
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
// reads that status once: a non-zero status makes the read fail (check
// "raise", the SDK's default), so the SDK's Observation has exit_code 1 and
// its failure_reason and output name the real exit code and carry the
// command's output; with check "silent" the read answers the real exit code
// itself. Commands that do not have the SDK's exact shape run unchanged.
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
// command so that the job's exit status is kept.
func rewriteNohup(cmd, stateDir string) string {
	m := nohupStart.FindStringSubmatch(cmd)
	if m == nil {
		return cmd
	}
	body, out := m[1], m[2]
	rc := rcFile(stateDir, out)
	return "mkdir -p " + stateDir + "/rc; rm -f " + rc + "\n" +
		"( trap '' HUP; ( " + body + "\n) < /dev/null > " + out + " 2>&1; echo $? > " + rc + " ) > /dev/null 2>&1 &\n" +
		"echo PIDSTART${!}PIDEND; disown 2> /dev/null || :"
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
