package execagent

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// How the agent outlives the limits its sandbox's commands run into. A
// sandbox at its pids limit (a fork bomb) or out of memory used to lose its
// agent: the Go runtime died when it could not create an OS thread
// ("failed to create new OS thread", exit code 2), and the OOM killer took
// the agent (a Go process, larger than most shells) as readily as the
// commands. Then nothing could recover the sandbox.

// maxReservedThreads bounds the OS threads reserveThreads keeps idle.
const maxReservedThreads = 16

// threadReserve is how many threads to reserve under a pids limit of
// pidsMax (0: none): an eighth of the limit, at most maxReservedThreads, so
// the reserve never takes a small limit for itself.
func threadReserve(pidsMax int) int {
	if pidsMax <= 0 {
		return maxReservedThreads
	}
	return min(maxReservedThreads, pidsMax/8)
}

// reserveThreads makes the Go runtime start n OS threads and keep them
// idle: it parks n goroutines locked to threads of their own (each needs a
// thread), then lets them go. The runtime keeps idle threads and takes one
// when a system call blocks (a slow write, a /proc read under load), so the
// agent seldom needs a new thread while its sandbox is at its pids limit,
// where creating one is fatal to a Go program. Waits for children hold no
// thread (waitExited).
func reserveThreads(n int) {
	var ready, release sync.WaitGroup
	ready.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			ready.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	ready.Wait()
	release.Done()
}

// childOOMScoreAdj is the oom_score_adj of the children the agent starts:
// the OOM killer picks among them before the agent, which keeps its own,
// lower value. A command may lower its own value again, down to the
// agent's; only its own sandbox pays for that.
const childOOMScoreAdj = 500

// oomScore gives each child childOOMScoreAdj right after it started. The
// agent cannot set it between fork and exec; raising its own value around
// the fork instead (for the child to inherit) was tried and made the agent
// itself the OOM killer's first choice while it forked, which under memory
// pressure (a fork bomb) killed it. Written after the start, a child that
// forks within microseconds of its exec (before the write) leaves a few
// children at the agent's value; everything they fork after the write
// inherits childOOMScoreAdj. Anyone may raise a process of their own. Its
// zero value does nothing.
type oomScore struct {
	on bool // the agent's own value is lower than childOOMScoreAdj
}

// readOOMScore reads the agent's own value.
func readOOMScore() oomScore {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return oomScore{}
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return oomScore{on: err == nil && n < childOOMScoreAdj}
}

// raise gives the just-started, unreaped child pid childOOMScoreAdj. A
// value that cannot be written is left alone: the child then has the
// agent's.
func (o oomScore) raise(pid int) {
	if o.on {
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(strconv.Itoa(childOOMScoreAdj)), 0)
	}
}
