#!/usr/bin/python3
"""A vLLM-like model server with sleep mode, written from vLLM's behaviour, not from thaw's code.

Usage: vllm_sleep_server.py --port N --name M --rec DIR [--load-ms N] [--mem BYTES]
               [--slices N] [--ctl FILE] [--token-ms N] [--tokens N]

Behaviour knobs are read (each time they matter) from the JSON control file --ctl, so a test
can change them while the server runs:
  sleep_ms, wake_ms      delay before /sleep, /wake_up answer
  sleep_fail             /sleep answers 500
  wake_fail              /wake_up answers 500
  wake_hang              /wake_up never answers
  die_asleep_ms          exit this long after falling asleep
  gen_ms                 delay of a non-streaming completion
Records (JSON lines) go to DIR/<name>.<pid>.jsonl.
"""
import asyncio, json, os, sys, time, argparse, signal

ap = argparse.ArgumentParser()
ap.add_argument('--port', type=int, required=True)
ap.add_argument('--name', required=True)
ap.add_argument('--rec', required=True)
ap.add_argument('--load-ms', type=int, default=300)
ap.add_argument('--mem', type=int, default=0)
ap.add_argument('--slices', type=int, default=0)
ap.add_argument('--ctl', default='')
ap.add_argument('--token-ms', type=int, default=20)
ap.add_argument('--tokens', type=int, default=5)
a = ap.parse_args()

os.makedirs(a.rec, exist_ok=True)
recf = open(os.path.join(a.rec, '%s.%d.jsonl' % (a.name, os.getpid())), 'a', buffering=1)
state = 'loading'   # loading, awake, dozing, asleep, waking
counts = {'req': 0, 'violations': 0}


def rec(ev, **kw):
    kw['ev'] = ev
    kw['t'] = time.time()
    kw['pid'] = os.getpid()
    kw['name'] = a.name
    recf.write(json.dumps(kw) + '\n')


def ctl():
    if not a.ctl:
        return {}
    try:
        with open(a.ctl) as f:
            return json.load(f)
    except Exception:
        return {}


rec('start', port=a.port, mem=a.mem, slices=a.slices,
    env={k: v for k, v in os.environ.items() if k.startswith('CUDA_') or k.startswith('THAW')},
    argv=sys.argv)


def resp(status, body, ctype='application/json', extra=''):
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    b = body.encode()
    reason = {200: 'OK', 500: 'Internal Server Error', 503: 'Service Unavailable',
              404: 'Not Found', 400: 'Bad Request'}.get(status, 'X')
    return (f'HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(b)}\r\n'
            f'{extra}\r\n').encode() + b


async def handle(reader, writer):
    global state
    try:
        while True:
            head = await reader.readuntil(b'\r\n\r\n')
            lines = head.decode('latin1').split('\r\n')
            method, target, _ = lines[0].split(' ', 2)
            hdrs = {}
            for l in lines[1:]:
                if ':' in l:
                    k, v = l.split(':', 1)
                    hdrs[k.strip().lower()] = v.strip()
            n = int(hdrs.get('content-length', '0') or 0)
            body = await reader.readexactly(n) if n else b''
            path = target.split('?', 1)[0]
            q = target.split('?', 1)[1] if '?' in target else ''
            st_at = state
            counts['req'] += 1
            gen = path.startswith('/v1/')
            if gen and st_at != 'awake':
                counts['violations'] += 1
            rec('req', method=method, path=path, q=q, state=st_at, gen=gen,
                prio=hdrs.get('thaw-priority'))
            c = ctl()
            if path == '/health':
                if state == 'loading':
                    writer.write(resp(503, {'status': 'loading'}))
                else:
                    writer.write(resp(200, ''))
            elif path == '/is_sleeping':
                writer.write(resp(200, {'is_sleeping': state in ('asleep', 'dozing')}))
            elif path == '/sleep' and method == 'POST':
                state = 'dozing'
                rec('sleep_begin', q=q)
                await asyncio.sleep(c.get('sleep_ms', 50) / 1000)
                if c.get('sleep_fail'):
                    state = 'awake'
                    rec('sleep_failed')
                    writer.write(resp(500, {'error': 'sleep failed'}))
                else:
                    state = 'asleep'
                    rec('asleep', q=q)
                    writer.write(resp(200, ''))
                    d = c.get('die_asleep_ms')
                    if d is not None:
                        async def die():
                            await asyncio.sleep(d / 1000)
                            rec('die_asleep')
                            os._exit(3)
                        asyncio.ensure_future(die())
            elif path == '/wake_up' and method == 'POST':
                prev = state
                state = 'waking'
                rec('wake_begin', prev=prev)
                if c.get('wake_hang'):
                    rec('wake_hang')
                    await asyncio.sleep(100000)
                await asyncio.sleep(c.get('wake_ms', 50) / 1000)
                if c.get('wake_fail'):
                    state = 'asleep'
                    rec('wake_failed')
                    writer.write(resp(500, {'error': 'wake failed'}))
                else:
                    state = 'awake'
                    rec('awake')
                    writer.write(resp(200, ''))
            elif gen:
                if st_at != 'awake':
                    writer.write(resp(503, {'object': 'error', 'message': 'asleep', 'code': 503}))
                else:
                    try:
                        j = json.loads(body or b'{}')
                    except Exception:
                        j = {}
                    if j.get('stream'):
                        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n'
                                     b'Transfer-Encoding: chunked\r\n\r\n')
                        for i in range(a.tokens):
                            await asyncio.sleep(a.token_ms / 1000)
                            ev = 'data: ' + json.dumps({'object': 'text_completion', 'model': a.name,
                                                        'choices': [{'index': 0, 'text': 't%d ' % i}]}) + '\n\n'
                            e = ev.encode()
                            writer.write(b'%x\r\n%s\r\n' % (len(e), e))
                            await writer.drain()
                        e = b'data: [DONE]\n\n'
                        writer.write(b'%x\r\n%s\r\n0\r\n\r\n' % (len(e), e))
                    else:
                        await asyncio.sleep(c.get('gen_ms', a.token_ms * a.tokens) / 1000)
                        writer.write(resp(200, {'object': 'text_completion', 'model': a.name,
                                                'pid': os.getpid(),
                                                'gpu': os.environ.get('CUDA_VISIBLE_DEVICES'),
                                                'choices': [{'index': 0, 'text': 'ok'}]}))
            else:
                writer.write(resp(404, {'error': 'no'}))
            await writer.drain()
            if hdrs.get('connection', '').lower() == 'close':
                break
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    except Exception as e:
        rec('error', err=repr(e))
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    global state
    srv = await asyncio.start_server(handle, '127.0.0.1', a.port)
    await asyncio.sleep(a.load_ms / 1000)
    state = 'awake'
    rec('ready')
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    rec('exit', state=state, **counts)
    os._exit(0)

asyncio.run(main())
