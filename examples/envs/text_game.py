#!/usr/bin/env python3
"""Guess the number: a tiny seeded, deterministic text game for Quarry's env API.

reset(seed, options): options low (1), high (100), max_guesses (7). The observation is the rules.
step(action): an integer guess (a JSON number or a string of digits). The observation says
"higher", "lower" or "correct". Reward 1.0 and terminated on the right guess; truncated with
reward 0.0 once max_guesses are used. Steps after the episode ended are refused
(episode_not_running); a non-integer action is refused (invalid_action).
"""
import os
import random
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the envs (the image is read-only for them)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envproto import invalid_action, not_running, serve  # noqa: E402


class GuessTheNumber:
    def __init__(self):
        self.running = False

    def reset(self, seed, options):
        try:
            self.low = int(options.get("low", 1))
            self.high = int(options.get("high", 100))
            self.max_guesses = int(options.get("max_guesses", 7))
        except (TypeError, ValueError) as e:
            raise invalid_action("options: %s" % e)
        if self.low > self.high or self.max_guesses < 1:
            raise invalid_action("options: need low <= high and max_guesses >= 1")
        self.target = random.Random(seed).randint(self.low, self.high)
        self.guesses = 0
        self.running = True
        return {
            "observation": "I am thinking of a number between %d and %d. You have %d guesses."
            % (self.low, self.high, self.max_guesses),
            "info": {"low": self.low, "high": self.high, "max_guesses": self.max_guesses},
        }

    def step(self, action):
        if not self.running:
            raise not_running()
        if isinstance(action, bool) or not isinstance(action, (int, str)):
            raise invalid_action("the action must be an integer guess, got %r" % (action,))
        try:
            guess = int(action)
        except ValueError:
            raise invalid_action("the action must be an integer guess, got %r" % (action,))
        self.guesses += 1
        left = self.max_guesses - self.guesses
        if guess == self.target:
            self.running = False
            return {"observation": "correct", "reward": 1.0, "terminated": True, "truncated": False,
                    "info": {"guesses": self.guesses}}
        hint = "higher" if guess < self.target else "lower"
        truncated = left == 0
        if truncated:
            self.running = False
        return {"observation": hint, "reward": 0.0, "terminated": False, "truncated": truncated,
                "info": {"guesses": self.guesses, "left": left}}


if __name__ == "__main__":
    serve(GuessTheNumber())
