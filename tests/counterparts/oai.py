"""A small OpenAI-style HTTP client for tests, on http.client (one connection per call).

    r = chat(port, stream=True)
    assert r.status == 200 and r.done and len(r.chunks) == 8
"""
import http.client
import json
import time

DEFAULT_MODEL = "counterpart-model"


class Response:
    """status, reason, headers ({lower-case name: last value}), header_list, body (bytes),
    events (SSE data payloads in order, "[DONE]" included), elapsed (seconds)."""

    def __init__(self, status, reason, header_list, body, elapsed):
        self.status = status
        self.reason = reason
        self.header_list = header_list
        self.headers = {k.lower(): v for k, v in header_list}
        self.body = body
        self.elapsed = elapsed
        ctype = self.headers.get("content-type", "")
        self.events = parse_sse(body.decode("utf-8", "replace")) \
            if ctype.startswith("text/event-stream") else []

    def json(self):
        return json.loads(self.body)

    @property
    def done(self) -> bool:
        """The stream ended with `data: [DONE]`."""
        return bool(self.events) and self.events[-1] == "[DONE]"

    @property
    def chunks(self) -> list:
        """The JSON events of a stream, [DONE] left out."""
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    @property
    def text(self) -> str:
        """The generated text, from a stream's chunks or a whole JSON answer."""
        if self.events:
            return "".join(choice_text(c) for c in self.chunks)
        return choice_text(self.json())

    def __repr__(self):
        return f"<Response {self.status} {len(self.body)} bytes, {len(self.events)} events>"


def choice_text(obj) -> str:
    choice = (obj.get("choices") or [{}])[0]
    for key in ("delta", "message"):
        if key in choice:
            return choice[key].get("content") or ""
    return choice.get("text") or ""


def parse_sse(text: str) -> list:
    """The data payloads of the events in an SSE text (multi-line data joined by \\n)."""
    events, data = [], []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line == "":
            if data:
                events.append("\n".join(data))
                data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        events.append("\n".join(data))
    return events


def open_request(port, method, path, body=None, headers=None, host="127.0.0.1",
                 host_header=None, timeout=10.0):
    """Sends a request; returns (connection, http.client.HTTPResponse) for the caller to read
    (e.g. with iter_sse) and close."""
    hdrs = dict(headers or {})
    if host_header is not None:
        hdrs["Host"] = host_header
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        return conn, conn.getresponse()
    except BaseException:
        conn.close()
        raise


def request(port, method, path, body=None, headers=None, host="127.0.0.1", host_header=None,
            timeout=10.0) -> Response:
    """One request on a new connection; body may be bytes, str or a dict (sent as JSON)."""
    t0 = time.monotonic()
    conn, resp = open_request(port, method, path, body, headers, host, host_header, timeout)
    try:
        data = resp.read()
        return Response(resp.status, resp.reason, resp.getheaders(), data,
                        time.monotonic() - t0)
    finally:
        conn.close()


def iter_sse(resp):
    """Yields each SSE data payload of an open response as it arrives."""
    data = []
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8", "replace").rstrip("\r\n")
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def chat_body(model=DEFAULT_MODEL, stream=False, max_tokens=None, messages=None):
    body = {"model": model, "stream": stream,
            "messages": messages or [{"role": "user", "content": "hello"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def chat(port, host_header=None, model=DEFAULT_MODEL, stream=False, timeout=10.0,
         max_tokens=None, messages=None, headers=None, host="127.0.0.1",
         path="/v1/chat/completions") -> Response:
    """POST /v1/chat/completions."""
    return request(port, "POST", path, chat_body(model, stream, max_tokens, messages), headers,
                   host, host_header, timeout)


def completion(port, host_header=None, model=DEFAULT_MODEL, stream=False, timeout=10.0,
               max_tokens=None, prompt="hello", headers=None, host="127.0.0.1") -> Response:
    """POST /v1/completions."""
    body = {"model": model, "stream": stream, "prompt": prompt}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return request(port, "POST", "/v1/completions", body, headers, host, host_header, timeout)


def embeddings(port, inputs="hello", host_header=None, model=DEFAULT_MODEL, timeout=10.0,
               headers=None, host="127.0.0.1") -> Response:
    """POST /v1/embeddings."""
    return request(port, "POST", "/v1/embeddings", {"model": model, "input": inputs}, headers,
                   host, host_header, timeout)


def get(port, path, host_header=None, timeout=10.0, headers=None, host="127.0.0.1") -> Response:
    return request(port, "GET", path, None, headers, host, host_header, timeout)


def stats(port, host="127.0.0.1", timeout=5.0) -> dict:
    """GET /stats of a model-server counterpart."""
    return get(port, "/stats", timeout=timeout, host=host).json()
