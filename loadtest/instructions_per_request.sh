#!/usr/bin/env bash
# Instructions thaw executes per proxied request, counted by valgrind
# (callgrind): deterministic where timings are not (a shared machine, no
# hardware counters). Runs thaw in front of one nginx worker, sends A and then
# B keep-alive requests on one connection (two runs), and prints
# (instructions(B) - instructions(A)) / (B - A): start-up cancels out.
#
#   loadtest/instructions_per_request.sh [THAW_BIN] [A] [B]
# Figures only; not part of CI (valgrind makes it slow).
set -euo pipefail
BIN=${1:-$(dirname "$0")/../build/thaw}
A=${2:-500}
B=${3:-2500}
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

count() {
    local n=$1 d up port admin ng vg
    d=$(mktemp -d)
    up=$(free_port); port=$(free_port); admin=$(free_port)
    cat > "$d/up.conf" <<EOC
worker_processes 1; daemon off; pid $d/nginx.pid; error_log /dev/null crit;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $d/b; proxy_temp_path $d/p; fastcgi_temp_path $d/f;
       uwsgi_temp_path $d/u; scgi_temp_path $d/s; keepalive_requests 1000000;
       server { listen 127.0.0.1:$up; default_type application/json;
                location / { return 200 '{"object":"list","data":[]}'; } } }
EOC
    /usr/sbin/nginx -c "$d/up.conf" -p "$d" & ng=$!
    cat > "$d/thaw.json" <<EOC
{"listen":"127.0.0.1:$port","admin_listen":"127.0.0.1:$admin","log":{"level":"warn"},
 "models":[{"name":"bench","endpoints":["127.0.0.1:$up"],"max_concurrency":64}]}
EOC
    valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "$BIN" --config "$d/thaw.json" \
        > "$d/valgrind.log" 2>&1 & vg=$!
    /usr/bin/python3 - "$port" "$n" <<'EOP'
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
deadline = time.monotonic() + 60
while True:
    try:
        s = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
f = s.makefile("rb")
req = b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n"
for _ in range(n):
    s.sendall(req)
    f.readline()
    length = 0
    while (h := f.readline()) not in (b"\r\n", b""):
        if h.lower().startswith(b"content-length:"):
            length = int(h.split(b":")[1])
    f.read(length)
EOP
    kill -TERM "$vg"; wait "$vg" || true
    kill "$ng"; wait "$ng" 2>/dev/null || true
    awk '/^summary:/ {print $2}' "$d/cg.out"
    rm -rf "$d"
}

ia=$(count "$A")
ib=$(count "$B")
echo "instructions per request: $(( (ib - ia) / (B - A) )) ($BIN; $A and $B requests)"
