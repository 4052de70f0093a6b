"""A tiny env program for Quarry's env API (JSON lines on stdin/stdout),
used by tests/rock_gem_test.go: guess a number from 0 to 3 (the reset seed
mod 4). Actions are strings, as ROCK's RockEnv.step sends them."""
import json
import sys


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


target = None
for line in sys.stdin:
    req = json.loads(line)
    op = req.get("op")
    if op == "reset":
        seed = req.get("seed") or 0
        target = seed % 4
        reply({"observation": "guess a number from 0 to 3", "info": {"seed": seed}})
    elif op == "step":
        action = req.get("action")
        if target is None:
            reply({"error": "reset first", "code": "episode_not_running"})
        elif not isinstance(action, str) or not action.isdigit():
            reply({"error": f"action must be a digit string, got {action!r}", "code": "invalid_action"})
        elif int(action) == target:
            target = None
            reply({"observation": "correct", "reward": 1.0, "terminated": True, "truncated": False, "info": {}})
        else:
            hint = "higher" if int(action) < target else "lower"
            reply({"observation": hint, "reward": 0.0, "terminated": False, "truncated": False, "info": {"hint": hint}})
    elif op == "close":
        reply({"observation": None, "info": {}})
        break
