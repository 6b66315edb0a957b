"""The engine-independent half of dcr's engine adapters.

A WeightSource is one serving rank's weights as its dcr-relay keeps them in
a shared-memory store (docs/PLACEMENT.md §"Serving processes"), for an
inference engine's weight-update hooks: the vLLM WeightTransferEngine in
dcr_engines.vllm and the SGLang custom weight loader in dcr_engines.sglang
are thin calls into it.

The relay keeps the store as two images and flips them at each commit.
A background thread answers the relay's pause protocol (dcr.Receiver.poll)
and moves to each committed image as soon as the relay flips, so a commit
never waits on the engine. An update holds one image: acquire(step) waits
until the relay has committed that step, and from then until release() the
source does not move, and the relay does not write the held image (the
source holds its reader lock). The engine copies the image into its own
parameters in between: copy_into() for a store in the engine's own layout
(a serving layout of the engine's parameter names, FP8 codes included), or
the engine's loader over weights() for a canonical store.

Thread safety: every method may be called from any thread; acquire() and
release() pair up per update (an update may acquire the same step again).
"""

import re
import threading
import time

import torch

# Tensors a serving store keeps for the relay, not for the engine: the
# canonical bits FP8 codes are quantized from (docs/PLACEMENT.md §"FP8
# serving").
_SHADOW_SUFFIX = ".shadow"


class StaleStepError(RuntimeError):
    """The relay has committed a later step than the one asked for."""


class WeightSource:
    def __init__(self, store, socket="", wait=60.0, poll_seconds=0.005,
                 receiver_factory=None):
        """Maps `store` ("shm:NAME", as the relay was given it) and answers
        the relay on `socket` (its serving socket; empty: follow the live
        header alone). Waits up to `wait` seconds for the relay's first
        commit (KeyError after it). `receiver_factory(store, socket, wait)`
        replaces dcr.Receiver (tests)."""
        if receiver_factory is None:
            import dcr
            receiver_factory = dcr.Receiver
        self._receiver = receiver_factory(store, socket=socket, wait=wait)
        self.store = store
        self._poll_seconds = poll_seconds
        self._cond = threading.Condition()
        self._held = None  # the step an update holds, or None
        self._closed = False
        self._error = None  # the last poll's, while polls fail
        self._error_since = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="dcr-weight-source")
        self._thread.start()

    # -- the background thread ----------------------------------------------

    def _run(self):
        while True:
            with self._cond:
                if self._closed:
                    return
                try:
                    # While an update holds an image, answer only.
                    moved = self._receiver.poll(move=self._held is None)
                    self._error = None
                except Exception as e:  # the relay said something wrong
                    if self._error is None:
                        self._error_since = time.monotonic()
                    moved, self._error = False, e
                if moved or self._error is not None:
                    self._cond.notify_all()
            time.sleep(self._poll_seconds)

    # -- an update ----------------------------------------------------------

    @property
    def step(self):
        """The committed step the source is on."""
        with self._cond:
            self._check_open()
            return self._receiver.step

    def _check_open(self):
        if self._closed:
            raise RuntimeError("WeightSource of %s is closed" % self.store)

    # Polls that keep failing this long end a waiting acquire().
    ERROR_GRACE_SECONDS = 5.0

    def acquire(self, step=None, timeout=300.0):
        """Waits until the source is on committed step `step` and holds it
        until release(); None: the newest step the relay has committed.
        Returns the step. Ranks of one tensor-parallel engine must each
        name the same step, or they may hold different ones. A step the
        source is on is held even if the relay has committed a later one
        meanwhile (its image stays intact while held). TimeoutError if the
        relay has not committed `step` within `timeout` seconds;
        StaleStepError if the source has moved past it (the engine asked
        for a step the trainer has moved past); RuntimeError if the
        relay's answers have failed for ERROR_GRACE_SECONDS. A second
        acquire of the held step returns it; one release() ends the
        hold."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._check_open()
            if self._held is not None:
                if step is None or step == self._held:
                    return self._held
                raise RuntimeError(
                    "an update holds step %d of %s; release() it before "
                    "acquiring step %d" % (self._held, self.store, step))
            while True:
                now = self._receiver.step
                # A move the thread has not made yet (it polls every
                # poll_seconds): the relay may have flipped already.
                pending = self._receiver.pending_step()
                if now == step or (step is None and pending is None):
                    self._held = now
                    return now
                if step is not None and (now > step or (
                        pending is not None and pending > step)):
                    raise StaleStepError(
                        "%s holds step %d%s; step %d was asked for" %
                        (self.store, now, "" if pending is None else
                         " and the relay committed %d" % pending, step))
                if (self._error is not None and time.monotonic() -
                        self._error_since >= self.ERROR_GRACE_SECONDS):
                    raise RuntimeError(
                        "%s: the relay's answers have failed for %.0f s: %s"
                        % (self.store, time.monotonic() - self._error_since,
                           self._error))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        "%s: the relay has not committed step %s within "
                        "%.1f s (the store holds step %d%s)" %
                        (self.store, "a newer" if step is None else step,
                         timeout, now, "" if self._error is None else
                         "; last error: %s" % self._error))
                self._cond.wait(min(left, 0.1))
                self._check_open()  # close() while waiting

    def release(self):
        """Ends an update: the source follows the relay's commits again."""
        with self._cond:
            self._held = None

    def hold(self, step=None, timeout=300.0):
        """acquire() and release() as a context manager."""
        source = self

        class _Hold:
            def __enter__(self):
                return source.acquire(step, timeout)

            def __exit__(self, *exc):
                source.release()
                return False

        return _Hold()

    def _check_held(self):
        self._check_open()
        if self._held is None:
            raise RuntimeError("read %s's weights inside acquire()/release()"
                               % self.store)

    def tensors(self):
        """name -> tensor of the held image (views of the store, no copy;
        FP8 codes as torch.uint8), without the relay's own tensors. Valid
        until release()."""
        with self._cond:
            self._check_held()
            return {n: t for n, t in self._receiver.tensors().items()
                    if not n.endswith(_SHADOW_SUFFIX)}

    def weights(self):
        """The held image as (name, tensor) pairs, for an engine's
        load_weights: a canonical store's tensors in checkpoint names."""
        return list(self.tensors().items())

    def copy_into(self, params, strict=True, ignore=(), fp8_dtypes=None):
        """Copies every tensor of the held image into the parameter of the
        same name in `params` (name -> tensor, e.g. the engine's
        named_parameters()), in place: the parameters keep their storage,
        so CUDA graphs captured on them stay valid. Every pair is checked
        before the first byte is copied: names (with `strict`, a store
        tensor the engine lacks, or a parameter the store lacks and no
        pattern of `ignore` matches, e.g. r"\.k_scale$"), shapes, dtypes
        and layout (a parameter must be contiguous: a transposed weight
        would take the store's rows as its columns). FP8 codes (uint8 in
        the store) go bit for bit into a parameter of a dtype in
        `fp8_dtypes` (default: torch.float8_e4m3fn where torch has it).
        Returns {"tensors", "bytes", "seconds"}."""
        start = time.monotonic()
        if fp8_dtypes is None:
            fp8_dtypes = tuple(getattr(torch, n) for n in ("float8_e4m3fn",)
                               if hasattr(torch, n))
        patterns = [re.compile(p) for p in ignore]
        tensors = self.tensors()
        missing = sorted(set(tensors) - set(params))
        unfed = sorted(n for n in set(params) - set(tensors)
                       if not any(p.search(n) for p in patterns))
        if strict and (missing or unfed):
            raise KeyError(
                "%s and the engine's parameters differ: %s%s (is the relay's "
                "serving layout the engine's, at its tensor-parallel rank?)" %
                (self.store,
                 "the store holds %s the engine lacks" % _few(missing)
                 if missing else "",
                 ("; " if missing else "") +
                 "the engine has %s the store lacks" % _few(unfed)
                 if unfed else ""))
        pairs = []
        for name, src in tensors.items():
            dst = params.get(name)
            if dst is None:
                continue
            out = dst.data
            if tuple(out.shape) != tuple(src.shape):
                raise ValueError(
                    "%s: tensor '%s' is %s in the store but %s in the "
                    "engine; nothing was copied" %
                    (self.store, name, list(src.shape), list(out.shape)))
            if not out.is_contiguous():
                raise ValueError(
                    "%s: the engine's parameter '%s' is not contiguous (a "
                    "transposed weight?); the store holds it row-major; "
                    "nothing was copied" % (self.store, name))
            if out.dtype != src.dtype:
                if src.dtype != torch.uint8 or out.dtype not in fp8_dtypes:
                    raise ValueError(
                        "%s: tensor '%s' is %s in the store but %s in the "
                        "engine; nothing was copied" %
                        (self.store, name, src.dtype, out.dtype))
                out = out.view(torch.uint8)  # FP8 codes, bit for bit
            pairs.append((out, src))
        copied = 0
        with torch.no_grad():
            for out, src in pairs:
                out.copy_(src)
                copied += src.numel() * src.element_size()
        return {"tensors": len(pairs), "bytes": copied,
                "seconds": time.monotonic() - start}

    def close(self):
        """Stops the thread and unmaps the store (after release())."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._held = None
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self._receiver = None


def load_weights(source, model):
    """Hands the held image to `model.load_weights` (an engine's loader,
    which places canonical tensors in its own layout). Returns
    {"tensors", "bytes", "seconds"}."""
    start = time.monotonic()
    weights = source.weights()
    model.load_weights(weights)
    return {"tensors": len(weights),
            "bytes": sum(t.numel() * t.element_size() for _, t in weights),
            "seconds": time.monotonic() - start}


def _few(names, most=5):
    shown = ", ".join("'%s'" % n for n in names[:most])
    return shown + (" and %d more" % (len(names) - most)
                    if len(names) > most else "")
