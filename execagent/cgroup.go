package execagent

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Where the kernel counts the OOM kills of a memory cgroup: cgroup v2's
// memory.events and cgroup v1's memory.oom_control (since Linux 4.13) both
// have a line "oom_kill N", the processes of the cgroup (v2: and of its
// descendants) that any OOM killer killed. memory.failcnt (v1) counts
// hits of the limit, most of which reclaim ends without a kill: it says
// nothing about a kill.
const (
	cgroupRoot     = "/sys/fs/cgroup"
	oomFileV1      = "memory.oom_control"
	oomFileV2      = "memory.events"
	oomKillCounter = "oom_kill"
)

// oomCounter reads the OOM kill count of the agent's memory cgroup: in a
// container, the sandbox's own (the container's limit); under the process
// provider, whatever cgroup the gateway runs in (a session scope or a
// service), shared with everything else there. Its zero value (no counter
// found: no memory controller, an older kernel) reads nothing.
type oomCounter struct {
	path string
}

// findOOMCounter finds the counter of the cgroup that selfCgroup
// (/proc/self/cgroup's content) names, below root (/sys/fs/cgroup).
func findOOMCounter(selfCgroup []byte, root string) oomCounter {
	for _, p := range cgroupFiles(selfCgroup, root, "memory", oomFileV1, oomFileV2) {
		if _, ok := (oomCounter{path: p}).read(); ok {
			return oomCounter{path: p}
		}
	}
	return oomCounter{}
}

// cgroupFiles returns where the agent's cgroup keeps a controller's file
// (v1File in the controller's v1 hierarchy, v2File in the v2 one), most
// likely first. It prefers v1 (hybrid hosts mount v1 controllers beside a
// v2 hierarchy that lacks them), and tries each cgroup's own directory,
// then the hierarchy's root: a container without a cgroup namespace sees
// its own cgroup mounted at the root while /proc/self/cgroup names the
// host's path.
func cgroupFiles(selfCgroup []byte, root, controller, v1File, v2File string) []string {
	var v1, v2 []string
	for _, line := range strings.Split(string(selfCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = append(v2, filepath.Join(root, parts[2], v2File), filepath.Join(root, v2File))
		case containsWord(parts[1], controller):
			v1 = append(v1, filepath.Join(root, controller, parts[2], v1File), filepath.Join(root, controller, v1File))
		}
	}
	return append(v1, v2...)
}

// pidsMax returns the pids limit of the agent's cgroup (pids.max), or 0
// when it has none ("max") or none is found.
func pidsMax(selfCgroup []byte, root string) int {
	for _, p := range cgroupFiles(selfCgroup, root, "pids", "pids.max", "pids.max") {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return 0 // "max"
		}
		return n
	}
	return 0
}

// containsWord reports whether the comma-separated list holds w.
func containsWord(list, w string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == w {
			return true
		}
	}
	return false
}

// read returns the cgroup's OOM kill count; ok is false when there is no
// counter.
func (c oomCounter) read() (n int64, ok bool) {
	if c.path == "" {
		return 0, false
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), " ")
		if !found || k != oomKillCounter {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		return n, err == nil
	}
	return 0, false
}

// oomMark is the counter when a command started.
type oomMark struct {
	n  int64
	ok bool
}

// mark reads the counter for a command that starts now.
func (c oomCounter) mark() oomMark {
	n, ok := c.read()
	return oomMark{n: n, ok: ok}
}

// killedSince reports whether a command that started at m and ended now,
// with exit code code and signal sig, was OOM-killed: it died of SIGKILL
// (or its shell reported 137, 128+SIGKILL, for a command it ran) and the
// cgroup's OOM kill count rose meanwhile. The kernel does not say which
// process it killed; the OOM killer picks the largest, so with the count
// risen and the command killed it is almost always the command. The
// agent's own kills (a timeout, a kill request) are the caller's to leave
// out.
func (c oomCounter) killedSince(m oomMark, code int, sig string) bool {
	if !m.ok || (sig != "SIGKILL" && code != 128+9) {
		return false
	}
	n, ok := c.read()
	return ok && n > m.n
}
