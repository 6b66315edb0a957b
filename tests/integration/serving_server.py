#!/usr/bin/python3
"""A serving process for the pause protocol's tests (dcr.Receiver): it
"generates" in a loop on the tensors of its relay's live image and logs,
for every step, the version stamp read before and after the step and a
fingerprint of the weights the step computed on.

Usage: serving_server.py DCR_PYTHON_DIR STORE SOCKET CONTROL_DIR

CONTROL_DIR steers it while it runs: a file `hang` makes it stop calling
poll() (a server that never answers); `hold` makes it stop calling
poll() once it has answered a pause request after it saw the file (a
server paused for as long as the file is there); `slow` makes each step
take 1.5 s (or the seconds it holds); `stop` ends it. It writes `state.json` after every poll and appends
"before after image fingerprint" lines to `steps.log`.
"""
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
import dcr  # noqa: E402

store, socket, ctl = sys.argv[2], sys.argv[3], sys.argv[4]


def fingerprint(tensors):
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(dcr.tensor_digest(tensors[name]).encode())
    return h.hexdigest()[:16]


def write_state(r, polls):
    tmp = os.path.join(ctl, "state.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": r.step, "digest": r.digest, "image": r.image,
                   "flips": r.flips, "attached": r.attached,
                   "prepares": r.prepares, "polls": polls,
                   "pid": os.getpid()}, f)
    os.replace(tmp, os.path.join(ctl, "state.json"))


r = dcr.Receiver(store, socket=socket, wait=30.0)
tensors = r.tensors()
polls = 0
held_from = None  # r.prepares when `hold` appeared
with open(os.path.join(ctl, "steps.log"), "a") as log:
    while not os.path.exists(os.path.join(ctl, "stop")):
        if os.path.exists(os.path.join(ctl, "hang")):
            time.sleep(0.05)
            continue
        if os.path.exists(os.path.join(ctl, "hold")):
            if held_from is None:
                held_from = r.prepares
            elif r.prepares > held_from:
                time.sleep(0.05)
                continue
        else:
            held_from = None
        if r.poll():
            tensors = r.tensors()
        polls += 1
        write_state(r, polls)
        before = r.step
        fp = fingerprint(tensors)
        slow = os.path.join(ctl, "slow")
        if os.path.exists(slow):
            try:
                time.sleep(float(open(slow).read().strip() or 1.5))
            except (OSError, ValueError):
                time.sleep(1.5)
        else:
            time.sleep(0.01)
        # The weights a step computed on: the same before and after it.
        if fingerprint(tensors) != fp:
            fp = "MIXED"
        log.write(f"{before} {r.step} {r.image} {fp}\n")
        log.flush()
