#!/usr/bin/python3
"""Raw-socket scriptable model server. Each request's path selects a scenario: /s/NAME[?q].
Everything else: 200 JSON. /health: 200 ok.
usage: scripted_upstream.py (--port N | --port-file F) [--log F] [--health MODE]
Log: one JSON line per request received: conn id, method, path, headers, body length."""
import socket, threading, sys, os, json, time, argparse, gzip, struct

ap = argparse.ArgumentParser()
ap.add_argument('--port', type=int, default=0)
ap.add_argument('--port-file', default='')
ap.add_argument('--log', default='')
ap.add_argument('--host', default='127.0.0.1')
ap.add_argument('--load-ms', type=int, default=0)
ap.add_argument('--health', default='ok')
a = ap.parse_args()
time.sleep(a.load_ms / 1000)

LOG = open(a.log, 'a') if a.log else None
LOCK = threading.Lock()
CID = [0]
STATE = {'closed_conns': []}


def log(**kw):
    kw['t'] = time.time()
    if LOG:
        with LOCK:
            LOG.write(json.dumps(kw) + '\n'); LOG.flush()


def read_head(s, buf):
    while b'\r\n\r\n' not in buf:
        d = s.recv(65536)
        if not d:
            return None, buf
        buf += d
    i = buf.index(b'\r\n\r\n')
    return buf[:i].decode('latin1'), buf[i + 4:]


def read_body(s, buf, hdr):
    if 'content-length' in hdr:
        n = int(hdr['content-length'])
        while len(buf) < n:
            d = s.recv(65536)
            if not d:
                break
            buf += d
        return buf[:n], buf[n:]
    if hdr.get('transfer-encoding', '').lower() == 'chunked':
        body = b''
        while True:
            while b'\r\n' not in buf:
                buf += s.recv(65536)
            i = buf.index(b'\r\n'); n = int(buf[:i].split(b';')[0], 16); buf = buf[i + 2:]
            while len(buf) < n + 2:
                buf += s.recv(65536)
            body += buf[:n]; buf = buf[n + 2:]
            if n == 0:
                return body, buf
    return b'', buf


def chunk(b):
    return b'%x\r\n' % len(b) + b + b'\r\n'


J = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}'


def ok(body=J, extra=b''):
    return b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n' + extra + b'Content-Length: %d\r\n\r\n' % len(body) + body


# scenario: fn(s, req) -> 'keep' | 'close' | 'hang' | 'rst' | 'nobody'(close without reading)
def sc(name):
    def d(f):
        SC[name] = f; return f
    return d


SC = {}


def simple(name, data, action='keep'):
    SC[name] = lambda s, r: (s.sendall(data), action)[1]


# ---- framing
simple('cl', ok())
simple('chunked', b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'hello ') + chunk(b'world') + b'0\r\n\r\n')
simple('closedelim', b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nclose-delimited body', 'close')
simple('cl_te', b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'SMUGGLED-CHUNK') + b'0\r\n\r\n')
simple('te_cl', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n' + chunk(b'abc') + b'0\r\n\r\n')
simple('dup_cl_same', b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello')
simple('dup_cl_diff', b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 12\r\n\r\nhello world!')
simple('cl_list', b'HTTP/1.1 200 OK\r\nContent-Length: 5, 12\r\n\r\nhello world!')
simple('cl_plus', b'HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello')
simple('cl_neg', b'HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhello', 'close')
simple('cl_space', b'HTTP/1.1 200 OK\r\nContent-Length: 5 5\r\n\r\nhello', 'close')
simple('cl_huge', b'HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nhello', 'close')
simple('chunk_ext', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;foo=bar\r\nhello\r\n6;a="x;y"\r\n world\r\n0;end\r\n\r\n')
simple('trailers', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n' + chunk(b'hello') + b'0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n')
simple('te_gzip_chunked', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n' + chunk(gzip.compress(b'hello')) + b'0\r\n\r\n')
simple('te_chunked_comma', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n' + chunk(b'hello') + b'0\r\n\r\n', 'close')
simple('te_identity', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello')
simple('te_upper', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n' + chunk(b'hello') + b'0\r\n\r\n')
simple('te_two_hdrs', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'hello') + b'0\r\n\r\n')
simple('bad_chunk_size', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n', 'close')
simple('chunk_no_crlf', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX3\r\nabc\r\n0\r\n\r\n', 'close')
simple('chunk_overflow', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nhello', 'close')
# zero length chunk mid-stream: body ends there; rest is garbage on the connection
simple('zero_mid', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'part1') + b'0\r\n\r\n' + chunk(b'part2') + b'0\r\n\r\n')
# stray bytes after a complete CL response on keep-alive: a whole fake response
STRAY = b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\nX-Stray: 1\r\n\r\nSTRAYED'
simple('stray', ok(b'{"first":1}') + STRAY)
simple('stray_late', ok(b'{"first":1}'))  # handler below sends stray later
simple('head_body', b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello')  # for HEAD: body bytes are stray
simple('s204_body', b'HTTP/1.1 204 No Content\r\n\r\n' + STRAY)
simple('s204_cl', b'HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\nSTRAYED')
simple('s304_body', b'HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\nSTRAYED')
simple('s304_chunked', b'HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'STRAYED') + b'0\r\n\r\n')
simple('c100', b'HTTP/1.1 100 Continue\r\n\r\n' + ok(b'{"after":"100"}'))
simple('c103', b'HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n' + ok(b'{"after":"103"}'))
simple('c1xx_many', b''.join(b'HTTP/1.1 103 Early Hints\r\nLink: </x%d>\r\n\r\n' % i for i in range(50)) + ok(b'{"after":"many"}'))
simple('c1xx_flood', b''.join(b'HTTP/1.1 103 Early Hints\r\nLink: </x%d>\r\n\r\n' % i for i in range(20000)) + ok(b'{"after":"flood"}'))
simple('c101', b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nRAWBYTES', 'close')
simple('c102', b'HTTP/1.1 102 Processing\r\n\r\n' + ok(b'{"after":"102"}'))
simple('c100_cl', b'HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n' + ok(b'{"after":"100cl"}'))
simple('http10', b'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhttp/1.0 close-delimited', 'close')
simple('http10_cl', b'HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello')  # keep the conn open: 1.0 without keep-alive means close
simple('http10_ka', b'HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello')
simple('http09', b'hello there, no status line', 'close')
simple('http2', b'HTTP/2.0 200 OK\r\nContent-Length: 5\r\n\r\nhello')
simple('http11_lower', b'http/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello')
simple('st600', b'HTTP/1.1 600 Weird\r\nContent-Length: 5\r\n\r\nhello')
simple('st099', b'HTTP/1.1 099 Low\r\nContent-Length: 5\r\n\r\nhello')
simple('st000', b'HTTP/1.1 000 Zero\r\nContent-Length: 5\r\n\r\nhello')
simple('st999', b'HTTP/1.1 999 Nope\r\nContent-Length: 5\r\n\r\nhello')
simple('st_2digit', b'HTTP/1.1 20 OK\r\nContent-Length: 5\r\n\r\nhello', 'close')
simple('st_4digit', b'HTTP/1.1 2000 OK\r\nContent-Length: 5\r\n\r\nhello', 'close')
simple('st_noreason', b'HTTP/1.1 200\r\nContent-Length: 5\r\n\r\nhello')
simple('st_noreason_sp', b'HTTP/1.1 200 \r\nContent-Length: 5\r\n\r\nhello')
simple('st_oddreason', b'HTTP/1.1 200 \xc3\xa9\xff\t weird \x01reason\r\nContent-Length: 5\r\n\r\nhello')
simple('st_418', b'HTTP/1.1 418 I am a teapot\r\nContent-Length: 5\r\n\r\nhello')
simple('st_599', b'HTTP/1.1 599 Custom\r\nContent-Length: 5\r\n\r\nhello')
simple('st_garbage', b'GARBAGE\r\n\r\n', 'close')
simple('st_lf_only', b'HTTP/1.1 200 OK\nContent-Length: 5\n\nhello')
simple('hdr_lf', b'HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 5\r\n\r\nhello')
simple('hdr_obsfold', b'HTTP/1.1 200 OK\r\nX-Fold: a\r\n  continued\r\nContent-Length: 5\r\n\r\nhello')
simple('hdr_obsfold_cl', b'HTTP/1.1 200 OK\r\nX-Fold: a\r\n Content-Length: 100\r\nContent-Length: 5\r\n\r\nhello')
simple('hdr_nul', b'HTTP/1.1 200 OK\r\nX-Nul: a\x00b\r\nContent-Length: 5\r\n\r\nhello')
simple('hdr_cr', b'HTTP/1.1 200 OK\r\nX-Cr: a\rInjected: yes\r\nContent-Length: 5\r\n\r\nhello')
simple('hdr_space_name', b'HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello', 'close')
simple('hdr_nocolon', b'HTTP/1.1 200 OK\r\nNoColonHere\r\nContent-Length: 5\r\n\r\nhello', 'close')
simple('hdr_badname', b'HTTP/1.1 200 OK\r\nX(bad): 1\r\nContent-Length: 5\r\n\r\nhello', 'close')
simple('hdr_conn_close', b'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello', 'close')
simple('hdr_conn_close_lie', b'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello')  # says close but keeps open
simple('hdr_hop', b'HTTP/1.1 200 OK\r\nConnection: X-Secret, keep-alive\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: x\r\nContent-Length: 5\r\n\r\nhello')
simple('hdr_ka0', b'HTTP/1.1 200 OK\r\nKeep-Alive: timeout=0\r\nContent-Length: 5\r\n\r\nhello')
simple('hdr_ka1', b'HTTP/1.1 200 OK\r\nKeep-Alive: timeout=1\r\nContent-Length: 5\r\n\r\nhello')
simple('hdr_setcookie', b'HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 5\r\n\r\nhello')


@sc('hdr_huge')
def _(s, r):
    n = int(r['q'].get('n', '70000'))
    s.sendall(b'HTTP/1.1 200 OK\r\nX-Big: ' + b'a' * n + b'\r\nContent-Length: 5\r\n\r\nhello')
    return 'keep'


@sc('hdr_many')
def _(s, r):
    n = int(r['q'].get('n', '5000'))
    s.sendall(b'HTTP/1.1 200 OK\r\n' + b''.join(b'X-H%d: v\r\n' % i for i in range(n)) + b'Content-Length: 5\r\n\r\nhello')
    return 'keep'


@sc('hdr_endless')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\n')
    try:
        for i in range(100000):
            s.sendall(b'X-Endless-%d: %s\r\n' % (i, b'z' * 100))
    except OSError:
        pass
    return 'close'


# ---- timing
@sc('never')
def _(s, r):
    return 'hang'


@sc('head_stall')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial')
    return 'hang'


@sc('head_stall_chunked')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'first'))
    return 'hang'


@sc('midchunk_stall')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc')
    return 'hang'


@sc('slow')
def _(s, r):
    data = ok(b'{"slow":"' + b'x' * int(r['q'].get('n', '20')) + b'"}')
    d = float(r['q'].get('d', '1'))
    for i in range(len(data)):
        s.sendall(data[i:i + 1]); time.sleep(d)
    return 'keep'


@sc('close_after_head')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n')
    return 'close'


@sc('close_after_head_chunked')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n')
    return 'close'


@sc('close_before_head')
def _(s, r):
    return 'close'


@sc('rst_before_head')
def _(s, r):
    return 'rst'


@sc('rst_midbody')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n' + b'a' * 100)
    time.sleep(0.2)
    return 'rst'


@sc('rst_midchunk')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'data: {"a":1}\n\n'))
    time.sleep(0.2)
    return 'rst'


@sc('partial_head_close')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Len')
    return 'close'


@sc('partial_head_hang')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Len')
    return 'hang'


@sc('close_delim_then_rst')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\n\r\nsome data')
    time.sleep(0.2)
    return 'rst'


@sc('delay')
def _(s, r):
    time.sleep(float(r['q'].get('d', '1')))
    s.sendall(ok(b'{"delayed":1}'))
    return 'keep'


# keep-alive then close after idle of d seconds (the server's keep-alive timer)
@sc('ka_idle_close')
def _(s, r):
    s.sendall(ok(b'{"ka":1}', b'Keep-Alive: timeout=%s\r\n' % r['q'].get('adv', '60').encode() if 'adv' in r['q'] else b''))
    return ('idleclose', float(r['q'].get('d', '0.5')))


# answer then close our side for reading-only without FIN? -> close right after response without Connection: close
simple('close_no_hdr', ok(b'{"closed":1}'), 'close')


# ---- early answers
@sc('early413')
def _(s, r):
    s.sendall(b'HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 28\r\n\r\n{"error":"payload too big!"}')
    return 'early'


@sc('early400_ka')
def _(s, r):
    s.sendall(b'HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nearly')
    return 'early_keep'


# ---- SSE
def sse_events(n, prefix=b'tok'):
    return [b'data: {"choices":[{"delta":{"content":"%s%d"}}]}\n\n' % (prefix, i) for i in range(n)] + [b'data: [DONE]\n\n']


@sc('sse_split')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n')
    data = b''.join(sse_events(20))
    i = 0; k = 1
    while i < len(data):
        piece = data[i:i + k]; i += k; k = (k * 7 + 3) % 13 + 1
        s.sendall(chunk(piece)); time.sleep(0.005)
    s.sendall(b'0\r\n\r\n')
    return 'keep'


@sc('sse_split_raw')
def _(s, r):
    # chunk framing itself split at odd byte boundaries over TCP
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n')
    data = b''.join(chunk(e) for e in sse_events(20)) + b'0\r\n\r\n'
    for i in range(0, len(data), 3):
        s.sendall(data[i:i + 3]); time.sleep(0.002)
    return 'keep'


@sc('sse_closedelim')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n')
    for e in sse_events(10):
        s.sendall(e); time.sleep(0.01)
    return 'close'


@sc('sse_gzip')
def _(s, r):
    z = gzip.compress(b''.join(sse_events(30)))
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n')
    for i in range(0, len(z), 50):
        s.sendall(chunk(z[i:i + 50])); time.sleep(0.005)
    s.sendall(b'0\r\n\r\n')
    return 'keep'


@sc('sse_endless')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n')
    t0 = time.time(); i = 0
    try:
        while time.time() - t0 < 60:
            s.sendall(chunk(b'data: {"i":%d}\n\n' % i)); i += 1; time.sleep(0.05)
    except OSError as e:
        log(event='sse_endless_closed', cid=r['cid'], after=time.time() - t0, err=str(e), sent=i)
        return 'close'
    log(event='sse_endless_timeout', cid=r['cid'])
    return 'close'


@sc('sse_bigline')
def _(s, r):
    n = int(r['q'].get('n', '5'))
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n')
    for i in range(n):
        s.sendall(chunk(b'data: ' + (b'%d' % (i % 10)) * (1 << 20) + b'\n\n'))
    s.sendall(chunk(b'data: [DONE]\n\n') + b'0\r\n\r\n')
    return 'keep'


@sc('big_cl')
def _(s, r):
    n = int(r['q'].get('n', str(50 << 20)))
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n' % n)
    blk = b'b' * 65536; left = n
    while left:
        k = min(left, len(blk)); s.sendall(blk[:k]); left -= k
    return 'keep'


@sc('cd_rst_now')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nsome data')
    return 'rst'


@sc('cd_sse_rst')
def _(s, r):
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n')
    for e in sse_events(5)[:-1]:
        s.sendall(e); time.sleep(0.05)
    return 'rst'


@sc('cd_rst_unread')
def _(s, r):
    # classic crash: the process dies with unread request bytes in its socket -> kernel sends RST
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nsome data')
    time.sleep(0.2)
    return 'rst'

simple('head_ok', b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n')
simple('head_chunked', b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n')
simple('head_nolen', b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n')


@sc('c1xx_endless')
def _(s, r):
    try:
        for i in range(600):
            s.sendall(b'HTTP/1.1 103 Early Hints\r\nLink: </x%d>\r\n\r\n' % i); time.sleep(0.1)
    except OSError:
        pass
    return 'close'


@sc('body_trickle')
def _(s, r):
    n = int(r['q'].get('n', '5')); d = float(r['q'].get('d', '1'))
    s.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n' % n)
    for i in range(n):
        s.sendall(b'x'); time.sleep(d)
    return 'keep'


HEALTH = {
    'ok': b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
    'stray': b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok' + STRAY,
    'stray_late': b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
    'head_body': b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA',
    'c103': b'HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
    'http10': b'HTTP/1.0 200 OK\r\n\r\nok',
    's204cl': b'HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\nSTRAYED',
    'closedelim': b'HTTP/1.1 200 OK\r\n\r\nok',
    'http10_cl': b'HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok',
    'cl_close': b'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok',
    's204': b'HTTP/1.1 204 No Content\r\n\r\n',
    'chunked': b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
}



@sc('stray_first')
def _(s, r):
    # an unsolicited response first, then (gap g seconds later) the real answer
    s.sendall(STRAY)
    time.sleep(float(r['q'].get('g', '0.0005')))
    s.sendall(ok(b'{"real":"%s"}' % r['path'].encode()))
    return 'keep'


def parse_q(path):
    q = {}
    if '?' in path:
        for kv in path.split('?', 1)[1].split('&'):
            if '=' in kv:
                k, v = kv.split('=', 1); q[k] = v
    return q


def handle(s, cid):
    buf = b''
    nreq = 0
    try:
        while True:
            head, buf = read_head(s, buf)
            if head is None:
                log(event='eof', cid=cid, leftover=len(buf)); return
            lines = head.split('\r\n'); rl = lines[0].split(' ')
            method, path = rl[0], rl[1] if len(rl) > 1 else ''
            hdr = {}
            for l in lines[1:]:
                if ':' in l:
                    k, v = l.split(':', 1); hdr[k.strip().lower()] = v.strip()
            name = path.split('?')[0]
            name = name[3:].split('/')[0] if name.startswith('/s/') else name
            r = {'cid': cid, 'method': method, 'path': path, 'hdr': hdr, 'q': parse_q(path), 'n': nreq}
            nreq += 1
            f = SC.get(name)
            if name.startswith('/health'):
                log(event='req', cid=cid, method=method, path=path, n=r['n'], health=True)
                body, buf = read_body(s, buf, hdr)
                s.sendall(HEALTH.get(a.health, HEALTH['ok']))
                if a.health == 'stray_late':
                    time.sleep(0.01); s.sendall(STRAY)
                if a.health in ('http10', 'closedelim', 'http10_cl', 'cl_close'):
                    return
                continue
            if name == 'early400_slow':
                log(event='req', cid=cid, method=method, path=path, n=r['n'], hdr=hdr, early=True)
                s.sendall(b'HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{"error":"early"}'[:0] + b'HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{"error":"early"}')
                time.sleep(float(r['q'].get('d', '1')))
                body, buf = read_body(s, buf, hdr)
                log(event='early_body', cid=cid, blen=len(body), idx=body.find(b'GET /v1/victim'), tail=body[-300:].decode('latin1'), leftover=len(buf), lefttext=buf[:300].decode('latin1'))
                continue
            if name == 'duplex':
                log(event='req', cid=cid, method=method, path=path, n=r['n'], hdr=hdr, early=True)
                s.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n' + chunk(b'started;'))
                body, buf = read_body(s, buf, hdr)
                s.sendall(chunk(b'got %d bytes' % len(body)) + b'0\r\n\r\n')
                continue
            if name in ('early413', 'early400_ka'):
                log(event='req', cid=cid, method=method, path=path, n=r['n'], hdr=hdr, early=True)
                act = f(s, r)
                if act == 'early':
                    time.sleep(0.5); s.close(); return
                # keep: drain the body then continue
                body, buf = read_body(s, buf, hdr); continue
            body, buf = read_body(s, buf, hdr)
            log(event='req', cid=cid, method=method, path=path, n=r['n'], hdr=hdr, blen=len(body), leftover=len(buf))
            if f is None:
                act = (s.sendall(ok(b'{"path":"%s","n":%d,"cid":%d}' % (path.encode(), r['n'], cid))), 'keep')[1]
            else:
                act = f(s, r)
            if name == 'stray_late':
                time.sleep(float(r['q'].get('d', '0.3'))); s.sendall(STRAY)
            if act == 'keep':
                continue
            if isinstance(act, tuple) and act[0] == 'idleclose':
                s.settimeout(act[1])
                try:
                    d = s.recv(65536)
                    s.settimeout(None)
                    if d:
                        buf += d; continue
                except socket.timeout:
                    log(event='idleclose', cid=cid)
                return
            if act == 'hang':
                s.settimeout(120)
                try:
                    while True:
                        d = s.recv(65536)
                        if not d:
                            log(event='peer_closed', cid=cid); return
                except Exception:
                    return
            if act == 'rst':
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
                return
            return  # close
    except OSError as e:
        log(event='oserror', cid=cid, err=str(e))
    finally:
        try:
            s.close()
        except OSError:
            pass


def main():
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.host, a.port)); ls.listen(128)
    if a.port_file:
        tmp = a.port_file + '.tmp'; open(tmp, 'w').write(str(ls.getsockname()[1])); os.rename(tmp, a.port_file)
    while True:
        s, _ = ls.accept()
        CID[0] += 1
        log(event='accept', cid=CID[0])
        threading.Thread(target=handle, args=(s, CID[0]), daemon=True).start()


main()
