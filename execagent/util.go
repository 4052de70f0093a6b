package execagent

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// mergeEnv merges "K=V" lists; a key in a later list replaces the same key
// of an earlier one, keeping the earlier position.
func mergeEnv(lists ...[]string) []string {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	out := make([]string, 0, n)
	index := make(map[string]int, n)
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := index[k]; ok {
				out[i] = kv
				continue
			}
			index[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// resolvePath resolves p (field names it in errors) against the workdir.
func (s *Server) resolvePath(field, p string) (string, error) {
	if p == "" {
		return "", invalid(field, "required")
	}
	if strings.ContainsRune(p, 0) {
		return "", invalid(field, "contains a NUL byte")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.cfg.Workdir, p)
	}
	return filepath.Clean(p), nil
}

// resolveCwd resolves a command's cwd (empty: the workdir) and checks that
// it is a directory.
func (s *Server) resolveCwd(cwd string) (string, error) {
	if cwd == "" {
		return s.cfg.Workdir, nil
	}
	p, err := s.resolvePath("cwd", cwd)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", invalid("cwd", "%q: no such directory", cwd)
	}
	if !fi.IsDir() {
		return "", invalid("cwd", "%q is not a directory", cwd)
	}
	return p, nil
}

// runLimits validates a request's timeout_ms and max_output_bytes (0: the
// defaults).
func (s *Server) runLimits(timeoutMS, maxOutput int64) (time.Duration, int64, error) {
	timeout, err := s.timeout(timeoutMS)
	if err != nil {
		return 0, 0, err
	}
	limit, err := s.outputCap(maxOutput)
	if err != nil {
		return 0, 0, err
	}
	return timeout, limit, nil
}

// queryPath resolves the "path" query parameter against the workdir.
func (s *Server) queryPath(r *http.Request) (string, error) {
	return s.resolvePath("path", r.URL.Query().Get("path"))
}

// timeout validates a request's timeout_ms (0: the default).
func (s *Server) timeout(ms int64) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, invalid("timeout_ms", "must be non-negative, got %d", ms)
	case ms == 0:
		return s.cfg.DefaultTimeout, nil
	case ms > s.cfg.MaxTimeout.Milliseconds():
		return 0, invalid("timeout_ms", "%d is above the agent's maximum of %d", ms, s.cfg.MaxTimeout.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// outputCap validates a request's max_output_bytes (0: the default).
func (s *Server) outputCap(n int64) (int64, error) {
	switch {
	case n < 0:
		return 0, invalid("max_output_bytes", "must be non-negative, got %d", n)
	case n == 0:
		return s.cfg.DefaultOutputBytes, nil
	case n > s.cfg.MaxOutputBytes:
		return 0, invalid("max_output_bytes", "%d is above the agent's maximum of %d", n, s.cfg.MaxOutputBytes)
	}
	return n, nil
}

// utf8Split returns how many bytes of b end at a UTF-8 character boundary:
// a trailing incomplete (but so far valid) sequence is held back, so a
// character split across two reads is not turned into two U+FFFD.
func utf8Split(b []byte) int {
	n := len(b)
	for i := 1; i <= utf8.UTFMax-1 && i <= n; i++ {
		c := b[n-i]
		if c < 0x80 { // ASCII: boundary after it
			return n
		}
		if utf8.RuneStart(c) {
			need := 0
			switch {
			case c&0xE0 == 0xC0:
				need = 2
			case c&0xF0 == 0xE0:
				need = 3
			case c&0xF8 == 0xF0:
				need = 4
			default:
				return n
			}
			if i < need {
				return n - i
			}
			return n
		}
	}
	return n
}

// signalName names a signal "SIGKILL"; unknown signals "SIG<n>".
func signalName(sig unix.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "SIG" + strconv.Itoa(int(sig))
}

// parseSignal parses "TERM", "SIGTERM", "sigterm" or "15".
func parseSignal(v string) (unix.Signal, error) {
	if v == "" {
		return 0, invalid("signal", "required")
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n <= 0 || n > 64 {
			return 0, invalid("signal", "%d is not a signal number", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalid("signal", "unknown signal %q", v)
}
