package process

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// File names inside a task's directory Dir/<name>/.
const (
	recordFile = "task.json"  // the record below, mode 0600 (holds the token)
	addrFile   = "agent.addr" // written by the agent after binding
	logFile    = "agent.log"  // the agent's stdout and stderr
	workDir    = "work"       // the sandbox's workdir and HOME
)

// maxRecordBytes bounds how much of a task.json or an address file is read.
const maxRecordBytes = 64 << 10

// recordVersion is the format version of task.json.
const recordVersion = 1

// record is the content of Dir/<name>/task.json: everything needed to find
// and stop the task again from another gateway process.
type record struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Pool    string `json:"pool"`
	// PID is 0 until the agent was started.
	PID int `json:"pid"`
	// StartTime is field 22 of /proc/<pid>/stat (clock ticks after boot) and
	// BootID the boot it belongs to: a pid whose start time differs is
	// another process that reuses the number.
	StartTime uint64 `json:"start_time"`
	BootID    string `json:"boot_id"`
	// AgentURL is empty until the agent has written its address.
	AgentURL  string            `json:"agent_url"`
	Token     string            `json:"token"`
	Labels    map[string]string `json:"labels"`
	CreatedAt time.Time         `json:"created_at"`
}

// writeFileAtomic writes data to path with mode 0600 through a temporary
// file in the same directory and a rename, so readers see the old content
// or the new one, never a part.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*") // mode 0600
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func writeRecord(taskDir string, rec *record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode task record: %w", err)
	}
	return writeFileAtomic(filepath.Join(taskDir, recordFile), b)
}

// readRecord reads Dir/<name>/task.json. A missing file returns an error
// matching fs.ErrNotExist.
func readRecord(taskDir string) (*record, error) {
	b, err := readBounded(filepath.Join(taskDir, recordFile))
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(taskDir, recordFile), err)
	}
	if rec.Version != recordVersion {
		return nil, fmt.Errorf("decode %s: unknown version %d", filepath.Join(taskDir, recordFile), rec.Version)
	}
	return &rec, nil
}

// readBounded reads at most maxRecordBytes of path.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRecordBytes))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// tailFile returns up to n trailing bytes of path, for error messages.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		if _, err := f.Seek(st.Size()-n, io.SeekStart); err != nil {
			return ""
		}
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}
