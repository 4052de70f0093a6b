package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Stop sends SIGTERM to the agent's process group, waits up to
// Config.StopGrace (or ctx) for the agent to exit, then kills every process
// left in the agent's session with SIGKILL and removes the task's directory.
// It is idempotent: an unknown or already stopped task returns nil. It
// fails only if processes of the session survive SIGKILL (then the record
// stays, so a retry finds them) or the directory cannot be removed.
func (p *Provider) Stop(ctx context.Context, id string, reason string) error {
	if validateName(id) != nil {
		return nil // cannot be a task of ours
	}
	unlock, err := p.locks.lock(ctx, id)
	if err != nil {
		return fmt.Errorf("stop task %q: %w", id, err)
	}
	defer unlock()
	taskDir := p.taskDir(id)
	rec, rerr := readRecord(taskDir)
	if rerr != nil {
		// No record (unknown, or a launch that died before its first
		// record), or an unreadable one: there is no process to signal.
		if _, err := os.Lstat(taskDir); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		rec = nil
	}
	if rec != nil && p.sessionIsOurs(id, rec) {
		if alive, _ := p.agentAlive(id, rec); alive {
			_ = unix.Kill(-rec.PID, unix.SIGTERM)
			gctx, cancel := context.WithTimeout(ctx, p.cfg.StopGrace)
			_ = pollUntil(gctx, func() bool { alive, _ := p.agentAlive(id, rec); return !alive })
			cancel()
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if rec == nil || rec.PID == 0 {
		// A gateway that died between starting the agent and recording its
		// pid leaves an agent only its environment can identify.
		if pid, ok := findUnrecordedAgent(filepath.Join(taskDir, workDir)); ok {
			if err := p.sessions.kill(cctx, pid); err != nil {
				return fmt.Errorf("stop task %q: %w", id, err)
			}
		}
	}
	if err := p.destroy(cctx, id, rec); err != nil {
		return fmt.Errorf("stop task %q: %w", id, err)
	}
	p.logger.Info("task stopped", "task", id, "reason", reason)
	return nil
}

// destroy kills everything left in the task's session, reaps the agent if it
// is our child, and removes the task's directory. rec may be nil.
func (p *Provider) destroy(ctx context.Context, name string, rec *record) error {
	if rec != nil && p.sessionIsOurs(name, rec) {
		if err := p.sessions.kill(ctx, rec.PID); err != nil {
			return err
		}
		if c := p.reaper.get(name, rec.PID); c != nil {
			if err := pollUntil(ctx, func() bool { gone, _ := c.tryReap(); return gone }); err != nil {
				return fmt.Errorf("reap agent %d: %w", rec.PID, err)
			}
			p.reaper.forget(name)
		}
	}
	return removeTaskDir(p.taskDir(name))
}

// kill sends SIGKILL to every live process of session sid until none is
// left (processes may fork while they are being killed) or ctx ends.
func (s *sessionScanner) kill(ctx context.Context, sid int) error {
	for {
		pids, err := s.members(ctx, sid)
		if err != nil {
			return fmt.Errorf("kill session %d: %w", sid, err)
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if err := sleepCtx(ctx, pollInterval/2); err != nil {
			return fmt.Errorf("kill session %d: processes %v still alive: %w", sid, pids, err)
		}
	}
}

// removeTaskDir removes a task's directory, work directory first so that a
// failure leaves task.json for a retry. Directories the sandbox made
// read-only are made writable first.
func removeTaskDir(taskDir string) error {
	for _, dir := range []string{filepath.Join(taskDir, workDir), taskDir} {
		if err := os.RemoveAll(dir); err == nil {
			continue
		}
		makeDirsWritable(dir)
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove task directory: %w", err)
		}
	}
	return nil
}

// makeDirsWritable gives the owner full access to every directory below
// root (symlinks are not followed). Errors are left to the removal.
func makeDirsWritable(root string) {
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
}
