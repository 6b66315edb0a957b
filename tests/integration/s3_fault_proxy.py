#!/usr/bin/python3
"""An HTTP proxy in front of a test S3 server that injects S3's failures.

    s3_fault_proxy.py LISTEN_PORT UPSTREAM_PORT MODE [LISTEN_HOST]

MODE:
  slowdown:N   every Nth request is answered 503 SlowDown (not forwarded)
  error500:N   every Nth request is answered 500 InternalError
  always500    every request is answered 500 InternalError
  reset:N      every Nth request has its connection closed without an answer
  lostcomplete the first CompleteMultipartUpload is forwarded, then its
               answer dropped (the connection closed): the upload is done
               but the client does not know it
  error200complete  the first CompleteMultipartUpload is answered 200 with
               an <Error> document (InternalError), not forwarded
  delay:MS     every request waits MS milliseconds before it is forwarded
               (a store a round trip away; nothing injected)

LISTEN_HOST: the address to listen on (default 127.0.0.1); the upstream
is always 127.0.0.1.

Writes "ready" to stdout once listening; counts what it injected in
"injected=K" lines on stderr. Standard library only.
"""
import http.client
import http.server
import sys
import threading
import time

LISTEN, UPSTREAM, MODE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
LISTEN_HOST = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
KIND, _, EVERY = MODE.partition(":")
EVERY = int(EVERY or 1)
lock = threading.Lock()
count = 0
injected = 0

ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "error500": (500, "InternalError", "We encountered an internal error."),
    "always500": (500, "InternalError", "We encountered an internal error."),
}


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_any(self):
        global count, injected
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        completing = self.command == "POST" and "uploadId=" in self.path
        with lock:
            count += 1
            if KIND == "delay":
                inject = False
            elif KIND in ("lostcomplete", "error200complete"):
                inject = completing and injected == 0
            else:
                inject = KIND == "always500" or count % EVERY == 0
            if inject:
                injected += 1
                print(f"injected={injected}", file=sys.stderr, flush=True)
        if inject and KIND == "reset":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if inject and KIND == "error200complete":
            KIND_ERR = (200, "InternalError", "We encountered an internal error.")
        if inject and KIND != "lostcomplete":
            status, code, message = ERRORS.get(KIND) or KIND_ERR
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}'
                   f"</Code><Message>{message}</Message></Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        if KIND == "delay":
            time.sleep(EVERY / 1000)
        up = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=30)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("connection", "transfer-encoding")}
        up.request(self.command, self.path, body=body, headers=headers)
        r = up.getresponse()
        data = r.read()
        if inject:  # lostcomplete: the server acted; the answer is lost
            up.close()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("connection", "transfer-encoding",
                                 "content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        up.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


server = http.server.ThreadingHTTPServer((LISTEN_HOST, LISTEN), Proxy)
print("ready", flush=True)
server.serve_forever()
