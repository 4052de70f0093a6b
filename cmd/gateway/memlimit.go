package main

import (
	"bufio"
	"bytes"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memLimitShare is the part of the memory limit found that becomes the Go
// runtime's soft limit when GOMEMLIMIT is unset: the rest is for what the
// runtime does not count (thread stacks of cgo, the binary, page cache of
// the embedded store).
const memLimitShare = 0.9

// cgroupV1Unlimited is the smallest memory.limit_in_bytes that means no
// limit: cgroup v1 writes the largest page-aligned int64 (9223372036854771712).
const cgroupV1Unlimited = 1 << 62

// setMemoryLimit honours GOMEMLIMIT, and derives it when it is unset: the Go
// runtime reads GOMEMLIMIT itself (nothing here changes a limit it was
// given); without it the runtime paces collection by GOGC alone, and in a
// container or on Lambda the process could be killed for memory a
// collection would have freed. So it sets the runtime's soft limit to 90 %
// of the memory limit found (memoryLimit), or nothing without one. set is
// debug.SetMemoryLimit; root is "/" (tests give another).
func setMemoryLimit(getenv func(string) string, root string, set func(int64) int64, log *slog.Logger) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		log.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", v, "bytes", set(-1))
		return
	}
	limit, from := memoryLimit(getenv, root)
	if limit <= 0 {
		log.Info("no memory limit found (cgroup, Lambda); the Go runtime's soft limit stays unset: set GOMEMLIMIT to bound it")
		return
	}
	soft := int64(float64(limit) * memLimitShare)
	set(soft)
	log.Info("memory limit derived: GOMEMLIMIT is unset", "from", from, "limit_bytes", limit, "soft_limit_bytes", soft)
}

// memoryLimit returns the lowest memory limit that holds the process, in
// bytes, and where it was found; 0 when there is none. It reads the cgroup
// of the process (/proc/self/cgroup): v2's memory.max, or v1's
// memory.limit_in_bytes, of its cgroup and every parent up to the root
// (those that are mounted: under a cgroup namespace the root is the
// process's own); and, in Lambda, AWS_LAMBDA_FUNCTION_MEMORY_SIZE (MiB).
func memoryLimit(getenv func(string) string, root string) (int64, string) {
	var limit int64
	var from string
	lower := func(v int64, where string) {
		if v > 0 && (limit == 0 || v < limit) {
			limit, from = v, where
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup")); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			// hierarchy-ID:controllers:path; v2 is "0::path".
			parts := strings.SplitN(sc.Text(), ":", 3)
			if len(parts) != 3 {
				continue
			}
			switch {
			case parts[0] == "0" && parts[1] == "":
				lower(cgroupLimit(filepath.Join(root, "sys/fs/cgroup"), parts[2], "memory.max"))
			case hasController(parts[1], "memory"):
				lower(cgroupLimit(filepath.Join(root, "sys/fs/cgroup/memory"), parts[2], "memory.limit_in_bytes"))
			}
		}
	}
	if mib, err := strconv.ParseInt(getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), 10, 64); err == nil {
		lower(mib<<20, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
	}
	return limit, from
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// cgroupLimit returns the lowest limit in file of cgroup dir and its
// parents under mount, and the file it came from; "max", an unlimited v1
// value and a missing or unreadable file count as none.
func cgroupLimit(mount, dir, file string) (int64, string) {
	var limit int64
	var from string
	for d := path.Clean("/" + dir); ; d = path.Dir(d) {
		f := filepath.Join(mount, filepath.FromSlash(d), file)
		if b, err := os.ReadFile(f); err == nil {
			v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err == nil && v > 0 && v < cgroupV1Unlimited && (limit == 0 || v < limit) {
				limit, from = v, f
			}
		}
		if d == "/" {
			return limit, from
		}
	}
}

// applyMemoryLimit is setMemoryLimit for the process.
func applyMemoryLimit(log *slog.Logger) {
	setMemoryLimit(os.Getenv, "/", debug.SetMemoryLimit, log)
}
