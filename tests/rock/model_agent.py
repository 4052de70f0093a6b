"""The agent of tests/rock/model_driver.py, run inside the sandbox: an
OpenAI-client program that talks to an LLM for TURNS turns, each request
carrying the whole conversation so far, then exits. Every answer it got is
appended to ANSWERS (one JSON line per turn), for the driver to check.

Usage: python3 model_agent.py BASE_URL TURNS ANSWERS
The API key is $OPENAI_API_KEY when set (Quarry's relay needs the
sandbox's), else "unused" (ROCK's model service takes any).
"""
import json
import os
import sys

from openai import OpenAI


def main():
    base_url, turns, answers = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    client = OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "unused", max_retries=0, timeout=600)
    messages = [{"role": "user", "content": "turn 1: begin"}]
    for i in range(1, turns + 1):
        r = client.chat.completions.create(model="policy", messages=messages)
        content = r.choices[0].message.content
        with open(answers, "a") as f:
            f.write(json.dumps({"turn": i, "content": content}) + "\n")
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": f"turn {i + 1}: after {content}"})


if __name__ == "__main__":
    main()
