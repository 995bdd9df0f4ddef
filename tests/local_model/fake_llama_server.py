"""A stand-in for a llama.cpp build this CPU cannot run: it lists its model, then dies on the
first completion with SIGILL, as a build with instructions the VM cannot execute does.

Run as `python fake_llama_server.py llama_cpp.server --port N` (the marker argument makes
`localmodel` recognise the process as a model server).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "smollm2-135m-instruct"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        os.kill(os.getpid(), signal.SIGILL)

    def log_message(self, *_args: object) -> None:
        pass


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1])
    print(f"fake server listening on {port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
