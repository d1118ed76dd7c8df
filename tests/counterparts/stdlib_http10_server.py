#!/usr/bin/python3
"""Python http.server (HTTP/1.0, the module's default) whose handlers write no Content-Length:
the common minimal health endpoint. usage: stdlib_http10_server.py PORT"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.send_header('Content-Type', 'text/plain'); self.end_headers(); self.wfile.write(b'ok\n')
ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
