#!/usr/bin/env python3
"""A terminal task for Quarry's env API: the agent acts with bash commands, a verifier scores it.

Each episode gets a fresh task directory (options "dir", default ./task under the program's cwd)
holding input.txt, a few integers drawn from the seed. The first observation is the task:
write their sum to answer.txt. An action is a bash command, run in the task directory with a
timeout (options "command_timeout", 10 s); the observation is its exit code and output (at most
options "max_output", 8192 bytes). The action "submit" runs verify_sum.py, whose printed number
is the reward, and ends the episode (terminated). After options "max_steps" (30) steps the
episode is truncated with reward 0.
"""
import os
import random
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ beside the envs (the image is read-only for them)
sys.path.insert(0, HERE)
from envproto import invalid_action, log, not_running, serve  # noqa: E402

VERIFIER = os.path.join(HERE, "verify_sum.py")


class TerminalTask:
    def __init__(self):
        self.running = False

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
        try:
            p = subprocess.run(["bash", "-c", command], cwd=self.dir, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=self.timeout)
            code, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            code, out = 124, (e.output or b"") + b"\n[timed out after %gs]" % self.timeout
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
