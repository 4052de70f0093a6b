#!/usr/bin/env python3
"""A terminal task for Quarry's env API: the agent acts with bash commands, a verifier scores it.

Each episode gets a fresh task directory (options "dir", default ./task under the program's cwd)
holding input.txt, a few integers drawn from the seed. The first observation is the task:
write their sum to answer.txt. An action is a bash command, run in one shell kept open for the
episode (so cd, variables and functions persist between steps, as in a terminal; it starts in the
task directory), with a timeout (options "command_timeout", 10 s) after which the shell is killed
and a fresh one started; the observation is its exit code and output (at most options
"max_output", 8192 bytes). The action "submit" runs verify_sum.py, whose printed number
is the reward, and ends the episode (terminated). After options "max_steps" (30) steps the
episode is truncated with reward 0.
"""
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ beside the envs (the image is read-only for them)
sys.path.insert(0, HERE)
from envproto import invalid_action, log, not_running, serve  # noqa: E402

VERIFIER = os.path.join(HERE, "verify_sum.py")


class Shell:
    """A bash kept open for an episode. Each command is written to a file and sourced; its exit
    status comes back on a pipe of its own (never parsed out of the output), and everything the
    command wrote reached the output pipe before bash printed the status."""

    def __init__(self, cwd):
        self.private = tempfile.mkdtemp(prefix="terminal-task-")
        self.cmdfile = os.path.join(self.private, "command")
        self.status_r, status_w = os.pipe()
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, pass_fds=(status_w,))
        self.status_w = status_w
        os.close(status_w)  # the shell holds its copy
        self.out_fd = self.proc.stdout.fileno()
        os.set_blocking(self.out_fd, False)

    def read_out(self):
        """Returns what the output pipe holds now (b"" at its end, None when empty)."""
        try:
            return os.read(self.out_fd, 65536)
        except BlockingIOError:
            return None

    def close(self):
        # The shell stays in the env program's process group, so whatever escapes this (a daemon
        # that re-parented itself) still ends with the program when the agent stops it.
        for pid in [self.proc.pid] + descendants(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
        os.close(self.status_r)
        shutil.rmtree(self.private, ignore_errors=True)

    def run(self, command, timeout, max_output):
        """Returns (exit code, output bytes (at most max_output + 1), alive)."""
        with open(self.cmdfile, "w") as f:
            f.write(command + "\n")
        line = ". %s </dev/null %d>&-; printf '%%d\\n' $? >&%d\n" % (shq(self.cmdfile), self.status_w, self.status_w)
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()
        out, status = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.out_fd, selectors.EVENT_READ, "out")
        sel.register(self.status_r, selectors.EVENT_READ, "status")
        try:
            while b"\n" not in status:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 124, bytes(out) + b"\n[timed out after %gs; the shell was restarted]" % timeout, False
                for key, _ in sel.select(left):
                    if key.data == "out":
                        chunk = self.read_out()
                        if chunk == b"":
                            sel.unregister(self.out_fd)
                        elif chunk and len(out) <= max_output:
                            out += chunk[: max_output + 1 - len(out)]
                    else:
                        chunk = os.read(self.status_r, 64)
                        if not chunk:  # the command ended the shell (exit, exec, ...)
                            rest = self.read_out() or b""
                            out += rest[: max(0, max_output + 1 - len(out))]
                            return self.proc.wait(timeout=5), bytes(out), False
                        status += chunk
            while True:  # what the command wrote is in the pipe already
                chunk = self.read_out()
                if not chunk:
                    break
                if len(out) <= max_output:
                    out += chunk[: max_output + 1 - len(out)]
            return int(status.split(b"\n")[0]), bytes(out), True
        finally:
            sel.close()


def descendants(root):
    """The pids below root, from /proc (Linux)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def shq(s):
    return "'" + s.replace("'", "'\\''") + "'"


class TerminalTask:
    def __init__(self):
        self.running = False
        self.shell = None

    def new_shell(self):
        if self.shell:
            self.shell.close()
        self.shell = Shell(self.dir)

    def reset(self, seed, options):
        rng = random.Random(seed)
        self.dir = os.path.abspath(str(options.get("dir", "task")))
        self.max_steps = int(options.get("max_steps", 30))
        self.timeout = float(options.get("command_timeout", 10))
        self.max_output = int(options.get("max_output", 8192))
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        numbers = [rng.randint(1, 1000) for _ in range(rng.randint(3, 8))]
        with open(os.path.join(self.dir, "input.txt"), "w") as f:
            f.write("\n".join(str(n) for n in numbers) + "\n")
        self.steps = 0
        self.running = True
        self.new_shell()
        log("reset: task in %s, %d numbers" % (self.dir, len(numbers)))
        return {
            "observation": "You are in %s. Create a file answer.txt there containing the sum of the "
            "numbers in input.txt (one per line). Run bash commands; send 'submit' when done." % self.dir,
            "info": {"dir": self.dir, "max_steps": self.max_steps},
        }

    def step(self, action):
        if not self.running:
            raise not_running()
        if not isinstance(action, str) or not action.strip():
            raise invalid_action("the action must be a bash command (a non-empty string) or 'submit'")
        self.steps += 1
        if action.strip() == "submit":
            self.running = False
            reward, report = self.verify()
            return {"observation": report, "reward": reward, "terminated": True, "truncated": False,
                    "info": {"steps": self.steps}}
        code, output = self.run(action)
        truncated = self.steps >= self.max_steps
        if truncated:
            self.running = False
        return {"observation": "exit code: %d\n%s" % (code, output), "reward": 0.0, "terminated": False,
                "truncated": truncated, "info": {"steps": self.steps, "exit_code": code}}

    def run(self, command):
        code, out, alive = self.shell.run(command, self.timeout, self.max_output)
        if not alive:
            self.new_shell()
        text = out[: self.max_output].decode("utf-8", "replace")
        if len(out) > self.max_output:
            text += "\n[output truncated at %d bytes]" % self.max_output
        return code, text

    def verify(self):
        p = subprocess.run([sys.executable, VERIFIER, self.dir], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        try:
            reward = float(p.stdout.decode().strip().splitlines()[-1])
        except (IndexError, ValueError):
            reward = 0.0
        return reward, p.stderr.decode("utf-8", "replace").strip() or "verified"


if __name__ == "__main__":
    serve(TerminalTask())
