"""The env side of Quarry's JSON-lines env protocol (docs/ENVS.md), stdlib only.

An env program reads one JSON request per line on stdin and writes exactly one JSON reply per
line on stdout; logs go to stderr. serve(env) runs that loop over an object with reset(seed,
options) and step(action) methods; they return reply dicts or raise EnvError.
"""
import json
import sys


class EnvError(Exception):
    """A refusal sent to the trainer as {"error": message, "code": code}."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


def invalid_action(message):
    return EnvError(message, "invalid_action")


def not_running(message="the episode has ended or was never started"):
    return EnvError(message, "episode_not_running")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def serve(env):
    out = sys.stdout
    for line in sys.stdin:
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "reset":
                reply = env.reset(req.get("seed"), req.get("options") or {})
            elif op == "step":
                if "action" not in req:
                    raise invalid_action("step needs an action")
                reply = env.step(req["action"])
            elif op == "close":
                out.write("{}\n")
                out.flush()
                return
            else:
                raise EnvError("unknown op %r" % (op,))
        except EnvError as e:
            reply = {"error": str(e)}
            if e.code:
                reply["code"] = e.code
        except (ValueError, AttributeError) as e:
            reply = {"error": "bad request line: %s" % e}
        out.write(json.dumps(reply) + "\n")
        out.flush()
