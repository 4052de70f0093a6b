"""Quarry envs as gymnasium envs (``pip install quarry-sandbox[gymnasium]``).

    from quarry import Quarry
    from quarry.gym import make
    env = make(Quarry(), "guess")      # a gymnasium.Env
    obs, info = env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(50)
    env.close()
"""

from __future__ import annotations

from typing import Any

import gymnasium

from ._sync import Quarry

__all__ = ["QuarryEnv", "make"]


class QuarryEnv(gymnasium.Env[Any, Any]):
    """A gymnasium.Env whose episodes run in a Quarry env sandbox. Actions and
    observations are the env program's JSON values: pass action_space and
    observation_space when the env has fixed ones (default: Text spaces)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, client: Quarry, env_id: str, *, action_space: Any = None, observation_space: Any = None,
                 **make_kwargs: Any) -> None:
        super().__init__()
        self.env_id = env_id
        self._env = client.envs.make(env_id, **make_kwargs)
        self.sandbox_id: str = self._env.sandbox_id
        self.action_space = action_space if action_space is not None else gymnasium.spaces.Text(4096)
        self.observation_space = observation_space if observation_space is not None else gymnasium.spaces.Text(1 << 20)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        obs, info = self._env.reset(seed, options)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._env.step(action)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._env.close()


def make(client: Quarry, env_id: str, **kwargs: Any) -> QuarryEnv:
    """A :class:`QuarryEnv` of env_id made with the sync client."""
    return QuarryEnv(client, env_id, **kwargs)
