#!/usr/bin/env python3
"""The agent of the rollout example: it runs inside a sandbox and uses the
unmodified openai client. OPENAI_BASE_URL and OPENAI_API_KEY are set in every
sandbox command by Quarry, so its calls reach the model relay, where the
trainer answers them.

The task: compute TASK_A + TASK_B. The model may ask to run a shell command
("RUN: <command>") and sees its output, then gives its answer ("ANSWER: <n>"),
which the agent writes to answer.txt for the verifier.
"""
import os
import subprocess

from openai import OpenAI

client = OpenAI(max_retries=0)
stream = os.environ.get("EPISODE_STREAM") == "1"
a, b = os.environ["TASK_A"], os.environ["TASK_B"]
messages = [
    {"role": "system", "content": "Reply 'RUN: <shell command>' to run a command, or 'ANSWER: <number>'."},
    {"role": "user", "content": f"Compute {a} + {b}."},
]


def ask(msgs):
    if stream:
        parts = client.chat.completions.create(model="policy", messages=msgs, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    return client.chat.completions.create(model="policy", messages=msgs).choices[0].message.content


for _ in range(4):
    text = ask(messages).strip()
    messages.append({"role": "assistant", "content": text})
    if text.startswith("RUN:"):
        out = subprocess.run(text[4:].strip(), shell=True, capture_output=True, text=True, timeout=30)
        messages.append({"role": "user", "content": "OUTPUT: " + (out.stdout + out.stderr).strip()})
    elif text.startswith("ANSWER:"):
        with open("answer.txt", "w") as f:
            f.write(text[7:].strip())
        break
print("agent done after", len(messages) // 2, "turns")
