"""Drives Quarry's env API through ROCK's unmodified GEM client
(rock.make), as a ROCK user would: only ROCK_BASE_URL changes, with the
Quarry API key in it (http://rock:<key>@host:port), since RockEnv sends no
headers of its own. Prints "STEP <json>" lines for tests/rock_gem_test.go.

Environment: ROCK_BASE_URL, ROCK_ENV_ID."""
import json
import os
import sys

import rock


def emit(step, **fields):
    print("STEP " + json.dumps({"step": step, **fields}), flush=True)


def main():
    env = rock.make(os.environ["ROCK_ENV_ID"])
    emit("make", sandbox_id=env._sandbox_id)
    obs, info = env.reset(seed=6)
    emit("reset", observation=obs, info=info)
    obs, reward, terminated, truncated, info = env.step("0")
    emit("step_miss", observation=obs, reward=reward, terminated=terminated, truncated=truncated, info=info)
    try:
        env.step("not a number")
        emit("step_invalid", raised=False)
    except Exception as e:
        emit("step_invalid", raised=True, message=str(e))
    obs, reward, terminated, truncated, info = env.step("2")
    emit("step_hit", observation=obs, reward=reward, terminated=terminated, truncated=truncated)
    env.close()
    emit("close")

    try:
        rock.make("no-such-env")
        emit("bad_env", raised=False)
    except Exception as e:
        emit("bad_env", raised=True, message=str(e))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        emit("crash", type=type(e).__name__, message=str(e))
        sys.exit(1)
