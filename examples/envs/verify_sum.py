#!/usr/bin/env python3
"""Verifier of terminal_task.py: prints 1.0 when DIR/answer.txt holds the sum of DIR/input.txt's
numbers, else 0.0; says why on stderr. Usage: verify_sum.py DIR"""
import os
import sys

d = sys.argv[1]
with open(os.path.join(d, "input.txt")) as f:
    want = sum(int(x) for x in f.read().split())
try:
    with open(os.path.join(d, "answer.txt")) as f:
        got = int(f.read().strip())
except (OSError, ValueError) as e:
    print("no valid answer.txt: %s" % e, file=sys.stderr)
    print("0.0")
    sys.exit(0)
if got == want:
    print("correct: %d" % want, file=sys.stderr)
    print("1.0")
else:
    print("wrong: answer.txt says %d" % got, file=sys.stderr)
    print("0.0")
