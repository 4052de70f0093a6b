package process

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// sessionScanner answers "which live processes are in session sid" for
// every caller from shared scans of /proc. A scan reads every process's
// stat file, so it costs the machine's process count: a thousand stops at
// once, each scanning for itself (twice or more while it kills), was the
// process provider's whole CPU in the 1,000-sandbox benchmark. Callers that
// arrive while a scan runs wait for the next one, which serves them all;
// every caller gets a scan that started after it asked, so a kill is
// always checked against /proc as it is after the kill.
type sessionScanner struct {
	mu      sync.Mutex
	next    *sessionScan // the scan the next callers join; nil when none waits
	running bool
	scan    func() (map[int][]int, error) // scanSessions; tests replace it
}

type sessionScan struct {
	done      chan struct{}
	bySession map[int][]int
	err       error
}

// members returns the pids of the live (not zombie) processes of session
// sid, from a scan that started after the call.
func (s *sessionScanner) members(ctx context.Context, sid int) ([]int, error) {
	s.mu.Lock()
	if s.next == nil {
		s.next = &sessionScan{done: make(chan struct{})}
	}
	sc := s.next
	if !s.running {
		s.running = true
		go s.run()
	}
	s.mu.Unlock()
	select {
	case <-sc.done:
		return sc.bySession[sid], sc.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run performs scans while callers wait for one.
func (s *sessionScanner) run() {
	for {
		s.mu.Lock()
		sc := s.next
		s.next = nil
		if sc == nil {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		scan := s.scan
		if scan == nil {
			scan = scanSessions
		}
		sc.bySession, sc.err = scan()
		close(sc.done)
	}
}

// scanSessions reads every process's session from /proc. Processes that
// vanish during the scan, and zombies, are left out.
func scanSessions() (map[int][]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("scan /proc: %w", err)
	}
	out := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.dead() {
			continue // exited during the scan, or not readable: not ours
		}
		out[st.Session] = append(out[st.Session], pid)
	}
	return out, nil
}
