#!/usr/bin/env python3
"""The verifier of the rollout example: prints the episode's reward (1.0 for
the right sum in answer.txt, else 0.0)."""
import os

try:
    with open("answer.txt") as f:
        answer = f.read().strip()
except OSError:
    answer = ""
print("1.0" if answer == str(int(os.environ["TASK_A"]) + int(os.environ["TASK_B"])) else "0.0")
