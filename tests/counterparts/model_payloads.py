"""OpenAI-shaped payloads shared by the model-server counterparts.

Both asyncio_server.py and uvicorn_app.py answer with these bodies so a test
sees the same shapes whichever server it talks to.
"""
import hashlib
import json
import time
import uuid

MAX_TOKENS_CAP = 4096


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def error_body(message: str, err_type: str = "invalid_request_error", code=None) -> bytes:
    return dumps({"error": {"message": message, "type": err_type, "code": code}})


def parse_request(body: bytes):
    """Returns (dict, None) or (None, error message)."""
    if not body:
        return None, "request body is empty"
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, "request body is not valid JSON"
    if not isinstance(obj, dict):
        return None, "request body must be a JSON object"
    return obj, None


def token_count(req: dict, default: int) -> int:
    """max_tokens from the request when it is a positive integer, else the default."""
    n = req.get("max_tokens")
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        return min(n, MAX_TOKENS_CAP)
    return default


def token_text(i: int) -> str:
    return f"tok{i} "


def models_list(model: str) -> bytes:
    return dumps({"object": "list",
                  "data": [{"id": model, "object": "model", "created": 0,
                            "owned_by": "counterpart"}]})


def _ids(kind: str):
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return f"{prefix}-{uuid.uuid4().hex[:16]}", int(time.time())


def _usage(n: int) -> dict:
    return {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}


def completion(kind: str, model: str, n: int, served_by: str) -> bytes:
    """kind is "chat" or "text"; the whole answer in one JSON body."""
    rid, created = _ids(kind)
    text = "".join(token_text(i) for i in range(n))
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "length"}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        obj = "text_completion"
    return dumps({"id": rid, "object": obj, "created": created, "model": model,
                  "choices": [choice], "usage": _usage(n), "served_by": served_by})


def stream_events(kind: str, model: str, n: int):
    """Yields the SSE frames of a stream: one `data:` event per token, then [DONE].

    The last token's chunk carries finish_reason, so a stream of n tokens is
    exactly n JSON events followed by `data: [DONE]`.
    """
    rid, created = _ids(kind)
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    for i in range(n):
        finish = "length" if i == n - 1 else None
        if kind == "chat":
            delta = {"content": token_text(i)}
            if i == 0:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": token_text(i), "logprobs": None,
                      "finish_reason": finish}
        chunk = {"id": rid, "object": obj, "created": created, "model": model,
                 "choices": [choice]}
        yield b"data: " + dumps(chunk) + b"\n\n"
    yield b"data: [DONE]\n\n"


def _vector(text: str, dim: int = 8) -> list:
    digest = hashlib.sha256(text.encode()).digest()
    return [round((b - 128) / 128.0, 4) for b in digest[:dim]]


def embeddings(model: str, req: dict):
    """Returns (body, None) or (None, error message)."""
    inp = req.get("input")
    if isinstance(inp, str):
        inputs = [inp]
    elif isinstance(inp, list) and inp and all(isinstance(x, str) for x in inp):
        inputs = inp
    else:
        return None, "input must be a string or a non-empty list of strings"
    data = [{"object": "embedding", "index": i, "embedding": _vector(s)}
            for i, s in enumerate(inputs)]
    return dumps({"object": "list", "data": data, "model": model,
                  "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}}), None
