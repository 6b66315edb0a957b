#!/usr/bin/python3
"""dcr_engines.source.WeightSource, the engine-independent half of the
engine adapters (integrations/README.md), on a scripted receiver: the
waits, holds, refusals and copies, without a relay. engine_adapters_test.sh
runs it against real relays.

Usage: weight_source_test.py REPO
"""
import os
import sys
import threading
import time
import unittest

import torch

sys.path.insert(0, os.path.join(sys.argv[1], "integrations"))
from dcr_engines.source import StaleStepError, WeightSource  # noqa: E402


class ScriptedReceiver:
    """dcr.Receiver's surface: a live step, a pending one, poll(move)."""

    def __init__(self, store, socket="", wait=0.0):
        self.lock = threading.Lock()
        self.step = 1
        self.pending = None
        self.images = {1: self._image(1)}
        self.polls = []
        self.fail = None

    @staticmethod
    def _image(step):
        g = torch.Generator().manual_seed(step)
        w = torch.randn(4, 6, generator=g).to(torch.bfloat16)
        codes = torch.randint(0, 255, (3, 5), generator=g, dtype=torch.uint8)
        return {"w": w, "fp8": codes, "fp8.shadow": w[:3, :5].clone()}

    def commit(self, step):
        with self.lock:
            self.images[step] = self._image(step)
            self.pending = step

    def poll(self, move=True):
        with self.lock:
            self.polls.append(move)
            if self.fail:
                raise RuntimeError(self.fail)
            if move and self.pending is not None:
                self.step, self.pending = self.pending, None
                return True
            return False

    def pending_step(self):
        return self.pending

    def tensors(self):
        return self.images[self.step]


# The engine's FP8 parameter dtype: torch 1.13 has no float8, so int8
# stands in (copy_into's fp8_dtypes).
FP8 = (torch.int8,)


def params_like(image):
    return {"w": torch.zeros(4, 6, dtype=torch.bfloat16),
            "fp8": torch.zeros(3, 5, dtype=torch.int8)}


class WeightSourceTest(unittest.TestCase):
    def setUp(self):
        self.receivers = []

        def factory(store, socket="", wait=0.0):
            r = ScriptedReceiver(store, socket, wait)
            self.receivers.append(r)
            return r

        self.source = WeightSource("shm:/test", poll_seconds=0.001,
                                   receiver_factory=factory)
        self.r = self.receivers[0]

    def tearDown(self):
        self.source.close()

    def test_acquire_waits_for_the_step_and_copies_it_bit_for_bit(self):
        threading.Timer(0.05, self.r.commit, args=(2,)).start()
        self.assertEqual(self.source.acquire(2, timeout=5), 2)
        params = params_like(None)
        ptrs = {n: p.data_ptr() for n, p in params.items()}
        stats = self.source.copy_into(params, fp8_dtypes=FP8)
        self.source.release()
        want = self.r.images[2]
        self.assertTrue(torch.equal(params["w"], want["w"]))
        self.assertTrue(torch.equal(params["fp8"].view(torch.uint8),
                                    want["fp8"]))
        self.assertEqual({n: p.data_ptr() for n, p in params.items()}, ptrs)
        self.assertEqual(stats["tensors"], 2)
        self.assertEqual(stats["bytes"], 4 * 6 * 2 + 3 * 5)

    def test_an_update_holds_its_step_across_a_commit(self):
        self.assertEqual(self.source.acquire(1), 1)
        self.r.commit(2)
        time.sleep(0.05)
        self.assertEqual(self.source.step, 1)  # answered, did not move
        self.assertIn(False, self.r.polls)
        self.assertEqual(self.source.acquire(1), 1)  # the same step again
        with self.assertRaisesRegex(RuntimeError, "holds step 1"):
            self.source.acquire(2)
        self.source.release()
        deadline = time.monotonic() + 5
        while self.source.step != 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        self.assertEqual(self.source.step, 2)

    def test_a_step_moved_past_or_not_committed_is_refused(self):
        self.r.commit(2)
        deadline = time.monotonic() + 5
        while self.source.step != 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        with self.assertRaisesRegex(StaleStepError,
                                    "step 1 was asked for"):
            self.source.acquire(1, timeout=5)
        with self.assertRaisesRegex(TimeoutError,
                                    "has not committed step 3 within 0.1 s "
                                    r"\(the store holds step 2"):
            self.source.acquire(3, timeout=0.1)
        self.r.fail = "relay said no"
        with self.assertRaisesRegex(TimeoutError, "last error: relay said no"):
            self.source.acquire(3, timeout=0.1)

    def test_the_engine_and_the_store_must_agree(self):
        with self.assertRaisesRegex(RuntimeError, "inside acquire"):
            self.source.tensors()
        with self.source.hold(1):
            self.assertNotIn("fp8.shadow", self.source.tensors())
            with self.assertRaisesRegex(KeyError, "the store holds 'fp8' the "
                                        "engine lacks; the engine has 'x' "
                                        "the store lacks"):
                self.source.copy_into({"w": torch.zeros(4, 6, dtype=torch.bfloat16),
                                       "x": torch.zeros(1)})
            partial = {"w": torch.zeros(4, 6, dtype=torch.bfloat16)}
            self.assertEqual(
                self.source.copy_into(partial, strict=False)["tensors"], 1)
            # Parameters the store does not feed, by pattern.
            extra = dict(params_like(None), **{"a.k_scale": torch.ones(1)})
            self.source.copy_into(extra, ignore=[r"\.k_scale$"],
                                  fp8_dtypes=FP8)
            self.assertEqual(extra["a.k_scale"].item(), 1.0)
            # Each refusal leaves every parameter as it was: checked
            # before the first copy.
            for name, bad_value, error in [
                    ("fp8", torch.zeros(5, 3, dtype=torch.int8),
                     r"'fp8' is \[3, 5\] in the store but \[5, 3\]"),
                    ("fp8", torch.zeros(5, 3, dtype=torch.int8).t(),
                     "'fp8' is not contiguous"),
                    ("fp8", torch.zeros(3, 5, dtype=torch.bool),
                     "torch.uint8 in the store but torch.bool"),
                    ("w", torch.zeros(4, 6, dtype=torch.float32),
                     "torch.bfloat16 in the store but torch.float32")]:
                bad = params_like(None)
                bad[name] = bad_value
                with self.assertRaisesRegex(ValueError, error):
                    self.source.copy_into(bad, fp8_dtypes=FP8)
                self.assertTrue(all(bool((p == 0).all())
                                    for p in bad.values()), error)
            # Without fp8_dtypes (no float8 in this torch), int8 is refused.
            with self.assertRaisesRegex(ValueError, "torch.int8"):
                self.source.copy_into(params_like(None))
        self.source.close()
        with self.assertRaisesRegex(RuntimeError, "closed"):
            self.source.acquire(1)


    def test_a_step_the_source_is_on_is_held_though_a_later_one_came(self):
        # A lagging tensor-parallel rank: the relay committed 2, the source
        # has not moved; step 1's image is intact while held.
        self.r.pending = 2
        self.r.images[2] = self.r._image(2)
        with self.source.hold(1) as step:
            self.assertEqual(step, 1)
            self.assertTrue(torch.equal(self.source.tensors()["w"],
                                        self.r.images[1]["w"]))

    def test_the_newest_step_waits_for_a_pending_move(self):
        self.r.commit(2)
        self.assertEqual(self.source.acquire(None, timeout=5), 2)
        self.source.release()

    def test_failing_relay_answers_end_a_wait(self):
        self.source.ERROR_GRACE_SECONDS = 0.1
        self.r.fail = "the images hold different tensors"
        start = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "answers have failed for "
                                    ".*the images hold different tensors"):
            self.source.acquire(3, timeout=30)
        self.assertLess(time.monotonic() - start, 5)


class CloseTest(unittest.TestCase):
    def test_close_ends_a_waiting_acquire(self):
        source = WeightSource("shm:/test", poll_seconds=0.001,
                              receiver_factory=ScriptedReceiver)
        got = []

        def wait():
            try:
                source.acquire(5, timeout=30)
            except RuntimeError as e:
                got.append(str(e))

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.05)
        start = time.monotonic()
        source.close()
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - start, 2)
        self.assertEqual(got, ["WeightSource of shm:/test is closed"])
        source.close()  # again: nothing
        with self.assertRaisesRegex(RuntimeError, "closed"):
            source.step


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
