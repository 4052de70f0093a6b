package process

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// procStat is the part of /proc/<pid>/stat this provider uses.
type procStat struct {
	PID       int
	State     byte   // R, S, D, Z, X, ...
	Session   int    // session id
	StartTime uint64 // clock ticks after boot
}

// dead reports whether the process has ended (a zombie still has a stat file).
func (s procStat) dead() bool { return s.State == 'Z' || s.State == 'X' || s.State == 'x' }

// parseStat parses the contents of /proc/<pid>/stat. The command name is in
// parentheses and may itself contain spaces and parentheses, so fields are
// counted from the last ')'.
func parseStat(b []byte) (procStat, error) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return procStat{}, fmt.Errorf("parse proc stat: no command name")
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return procStat{}, fmt.Errorf("parse proc stat pid: %w", err)
	}
	// Fields after the name, numbered from 3 as in proc(5): state(3) ppid(4)
	// pgrp(5) session(6) ... starttime(22).
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("parse proc stat of %d: %d fields", pid, len(f))
	}
	sid, err := strconv.Atoi(f[3])
	if err != nil {
		return procStat{}, fmt.Errorf("parse proc stat session of %d: %w", pid, err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("parse proc stat starttime of %d: %w", pid, err)
	}
	return procStat{PID: pid, State: f[0][0], Session: sid, StartTime: start}, nil
}

// readStat reads /proc/<pid>/stat. A process that does not exist (or exits
// during the read, ESRCH) returns an error matching fs.ErrNotExist.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return procStat{}, fmt.Errorf("read stat of %d: %w", pid, fs.ErrNotExist)
		}
		return procStat{}, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	return parseStat(b)
}

// readBootID returns the kernel's boot id, which changes on every boot, so
// that a recorded (pid, start time) pair is compared only within one boot.
func readBootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// findUnrecordedAgent returns the pid of a live session leader whose
// environment names workDir as its QUARRY_AGENT_WORKDIR: the agent of a
// launch whose gateway died between starting it and recording its pid.
// ok is false when there is none.
func findUnrecordedAgent(workDir string) (pid int, ok bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	want := []byte("\x00QUARRY_AGENT_WORKDIR=" + workDir + "\x00")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.Session != pid || st.dead() {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		if bytes.Contains(append([]byte{0}, env...), want) {
			return pid, true
		}
	}
	return 0, false
}
