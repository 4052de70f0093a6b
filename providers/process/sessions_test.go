package process

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Many callers at once share scans of /proc: far fewer scans than callers.
func TestSessionScanner_ConcurrentCallersShareScans(t *testing.T) {
	st, err := readStat(os.Getpid())
	require.NoError(t, err)
	var s sessionScanner
	scans := 0
	var mu sync.Mutex
	s.scan = func() (map[int][]int, error) {
		mu.Lock()
		scans++
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // a scan of a busy machine's /proc
		return scanSessions()
	}
	const callers = 200
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pids, err := s.members(context.Background(), st.Session)
			assert.NoError(t, err)
			assert.Contains(t, pids, os.Getpid())
		}()
	}
	wg.Wait()
	t.Logf("%d callers, %d scans", callers, scans)
	assert.LessOrEqual(t, scans, callers/10, "callers share scans")
}

// A caller never gets a scan that began before it asked: a process that
// died before the call is not in the answer.
func TestSessionScanner_AnswersFromAScanAfterTheCall(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, cmd.Start())
	sid := cmd.Process.Pid
	require.Eventually(t, func() bool { m, _ := scanSessions(); return len(m[sid]) == 1 }, 5*time.Second, time.Millisecond, "the process shows in /proc")
	var s sessionScanner
	release, scanned := make(chan struct{}), make(chan struct{})
	first := true
	s.scan = func() (map[int][]int, error) {
		if first { // the first scan sees the process, then is slow
			first = false
			out, err := scanSessions()
			close(scanned)
			<-release
			return out, err
		}
		return scanSessions()
	}
	ctx := context.Background()
	got := make(chan []int, 1)
	go func() { pids, _ := s.members(ctx, sid); got <- pids }()
	<-scanned
	require.NoError(t, cmd.Process.Kill())
	_, _ = cmd.Process.Wait()
	late := make(chan []int, 1)
	go func() { pids, _ := s.members(ctx, sid); late <- pids }() // asks after the kill
	require.Eventually(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.next != nil }, 5*time.Second, time.Millisecond)
	close(release)
	assert.Equal(t, []int{sid}, <-got, "the first caller's scan ran before the kill")
	assert.Empty(t, <-late, "the later caller waited for a scan of its own")
}

// A caller whose ctx ends stops waiting.
func TestSessionScanner_WaitEndsWithItsContext(t *testing.T) {
	var s sessionScanner
	block := make(chan struct{})
	defer close(block)
	s.scan = func() (map[int][]int, error) { <-block; return nil, nil }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := s.members(ctx, 1)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}
