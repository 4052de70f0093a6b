"""Forward relay calls to an OpenAI-compatible server (vLLM, SGLang, ...)
through the ``openai`` client (``pip install quarry-sandbox[openai]``).

    handler = OpenAIForwarder(base_url="http://gpu-box:8000/v1", model="my-policy")
    await q.model.serve(handler, concurrency=256)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from ._model import ModelCall

__all__ = ["OpenAIForwarder"]


class OpenAIForwarder:
    """A serve handler that sends each call's body to an OpenAI-compatible
    server and answers with its completion (or its chunks, for a streaming
    call). model, when given, replaces the body's ``model``; extra_body is
    merged into every request. An error answer of the server is passed to the
    agent with its status."""

    def __init__(self, *, base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                 extra_body: Mapping[str, Any] | None = None, client: Any = None, timeout: float = 600.0) -> None:
        if client is None:
            try:
                import openai
            except ImportError as e:  # pragma: no cover - the extra is missing
                raise ImportError("OpenAIForwarder needs the openai package: pip install 'quarry-sandbox[openai]'") from e
            client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=0)
        self.client = client
        self.model = model
        self.extra_body = dict(extra_body or {})

    def _body(self, call: ModelCall) -> dict[str, Any]:
        body = dict(call.request) if isinstance(call.request, dict) else {}
        if self.model:
            body["model"] = self.model
        body.update(self.extra_body)
        return body

    async def __call__(self, call: ModelCall) -> Any:
        import openai

        body = self._body(call)
        create = self.client.completions.create if call.route == "completions" else self.client.chat.completions.create
        try:
            if call.stream:
                body.pop("stream", None)
                stream = await create(stream=True, **body)
                await call.respond_stream(_dump_chunks(stream))
                return None
            body.pop("stream", None)
            out = await create(**body)
        except openai.APIStatusError as e:
            await call.respond_error(e.status_code, str(e.message))
            return None
        return out.model_dump(exclude_none=True)


async def _dump_chunks(stream: Any) -> AsyncIterator[dict[str, Any]]:
    async for chunk in stream:
        yield chunk.model_dump(exclude_none=True)
