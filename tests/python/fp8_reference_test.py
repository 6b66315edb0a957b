#!/usr/bin/env python3
"""dcr's FP8 quantizer (dcr.quantize_fp8, docs/PLACEMENT.md "FP8 serving")
against an independent reference written from the OCP 8-bit floating point
specification (OFP8, E4M3) with NumPy, working on the bits: Debian's torch
has no float8 dtype.

The reference shares no code with dcr: the E4M3 values come from the
specification's formula, a value is converted by searching the sorted value
set for its nearest neighbours (ties to the even mantissa, saturation to
448), and each block's scale is computed with NumPy's IEEE F32 arithmetic.

Usage: fp8_reference_test.py MODULE_DIR
"""
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import dcr  # noqa: E402

E4M3_MAX = 448.0


def spec_values():
    """code -> value for the 256 E4M3 codes (OFP8 v1.0, table 1): bias 7,
    subnormals at exponent 0, S.1111.111 NaN, no infinities."""
    out = np.empty(256, dtype=np.float64)
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
        if e == 0xF and m == 7:
            v = np.nan
        elif e == 0:
            v = 2.0 ** (1 - 7) * (m / 8)
        else:
            v = 2.0 ** (e - 7) * (1 + m / 8)
        out[code] = -v if s else v
    return out


VALUES = spec_values()
POS_CODES = np.arange(0x7F)           # 0x00..0x7E: finite, non-negative
POS_VALUES = VALUES[POS_CODES]        # ascending


def ref_e4m3(x32):
    """E4M3 codes of an F32 array: round to nearest, ties to even mantissa,
    saturating to +-448, NaN -> 0x7F with the sign."""
    x32 = np.asarray(x32, dtype=np.float32)
    sign = np.signbit(x32).astype(np.uint8) << 7
    a = np.abs(x32.astype(np.float64))
    nan = np.isnan(a)
    a = np.where(nan, 0.0, np.minimum(a, E4M3_MAX))
    hi = np.clip(np.searchsorted(POS_VALUES, a, side="left"), 0, len(POS_VALUES) - 1)
    lo = np.clip(hi - 1, 0, None)
    d_hi = np.abs(POS_VALUES[hi] - a)
    d_lo = np.abs(a - POS_VALUES[lo])
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (POS_CODES[lo] % 2 == 0))
    code = np.where(pick_lo, POS_CODES[lo], POS_CODES[hi]).astype(np.uint8)
    code = np.where(nan, np.uint8(0x7F), code)
    return code | sign


def to_f32(bits, dtype):
    """F32 values of BF16/F16/F32 bits (exact widening)."""
    if dtype == "BF16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return bits.view(np.float16).astype(np.float32)
    return bits.view(np.float32)


def ref_quantize(bits, dtype, rows, cols, br, bc, min_amax=np.float32(1e-4)):
    x = to_f32(bits, dtype).reshape(rows, cols)
    if br == 0:
        br, bc = rows, cols
    down, across = -(-rows // br), -(-cols // bc)
    q = np.empty((rows, cols), dtype=np.uint8)
    s = np.empty((down, across), dtype=np.float32)
    f448 = np.float32(E4M3_MAX)
    for i in range(down):
        for j in range(across):
            blk = x[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            fin = np.abs(blk[np.isfinite(blk)])
            amax = fin.max() if fin.size else np.float32(0)
            m = np.maximum(np.float32(amax), np.float32(min_amax))
            mult = f448 / m                       # F32 division, RNE
            s[i, j] = m / f448
            with np.errstate(invalid="ignore", over="ignore"):
                q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = ref_e4m3(blk * mult)
    return q, s


def dcr_quantize(bits, dtype, rows, cols, br, bc, min_amax=1e-4):
    q, s = dcr.quantize_fp8(bits, dtype, rows, cols, br, bc, min_amax)
    down = 1 if br == 0 else -(-rows // br)
    return (np.frombuffer(q, dtype=np.uint8).reshape(rows, cols),
            np.frombuffer(s, dtype=np.float32).reshape(down, -1))


def compare(label, bits, dtype, rows, cols, br, bc, min_amax=1e-4):
    q, s = dcr_quantize(bits, dtype, rows, cols, br, bc, min_amax)
    rq, rs = ref_quantize(bits, dtype, rows, cols, br, bc, np.float32(min_amax))
    bad_s = np.flatnonzero(s.view(np.uint32) != rs.view(np.uint32))
    bad_q = np.flatnonzero(q != rq)
    assert bad_s.size == 0, f"{label}: {bad_s.size} scales differ, first {bad_s[:5]}"
    if bad_q.size:
        i = bad_q[0]
        raise AssertionError(
            f"{label}: {bad_q.size} of {q.size} codes differ; first at {i}: "
            f"input bits {int(bits.reshape(-1)[i]):#x}, dcr {q.reshape(-1)[i]:#04x}, "
            f"reference {rq.reshape(-1)[i]:#04x}")
    print(f"ok  {label}: {q.size} codes, {s.size} scales")


def bf16_of(x):
    """BF16 bits of F32 values, rounded to nearest even (as torch does)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def main():
    table = np.array(dcr.fp8_e4m3_table(), dtype=np.float64)
    same = (table == VALUES) | (np.isnan(table) & np.isnan(VALUES))
    assert same.all() and (np.signbit(table) == np.signbit(VALUES)).all(), \
        f"table differs at codes {np.flatnonzero(~same)}"
    print("ok  the E4M3 table is the specification's")

    # The conversion alone: with one scale and min_amax 448 (inputs at
    # most 448), mult is exactly 1. Every 257th F32 pattern up to 448, both
    # signs, and 64 ulps around every rounding boundary.
    grid = np.arange(0, 0x43E00001, 257, dtype=np.uint64).astype(np.uint32)
    mids = ((POS_VALUES[:-1] + POS_VALUES[1:]) / 2).astype(np.float32)
    marks = np.concatenate([mids, POS_VALUES.astype(np.float32)]).view(np.uint32)
    near = (marks[:, None].astype(np.int64) + np.arange(-64, 65)[None, :]).reshape(-1)
    near = near[(near >= 0) & (near <= 0x43E00000)].astype(np.uint32)
    pats = np.concatenate([grid, near])
    pats = np.concatenate([pats, pats | np.uint32(0x80000000),
                           np.array([0x7F800000, 0xFF800000, 0x7FC00000,
                                     0xFFC00001, 0x7F800001], dtype=np.uint32)])
    compare("conversion of F32 values up to 448 (mult = 1)", pats, "F32", 1,
            pats.size, 0, 0, min_amax=448.0)

    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.02, size=(300, 520)).astype(np.float32)
    w[0, 0] = np.nan
    w[0, 1] = np.inf
    w[5, 7] = -3.5
    w[:128, 128:256] = 0                     # an all-zero block
    w[130:140, 300:310] = 1e-39              # F32 subnormals
    compare("BF16 [300, 520] in 128x128 blocks", bf16_of(w), "BF16", 300, 520, 128, 128)
    compare("BF16 [300, 520], one scale", bf16_of(w), "BF16", 300, 520, 0, 0)
    compare("F32 [300, 520] in 128x128 blocks", w.view(np.uint32), "F32", 300, 520, 128, 128)
    compare("F16 [300, 520] in 64x32 blocks", w.astype(np.float16).view(np.uint16),
            "F16", 300, 520, 64, 32)
    every = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
    compare("every BF16 pattern, [512, 128] in 128x128 blocks", every, "BF16", 512, 128, 128, 128)
    compare("every BF16 pattern, [256, 256] in 1x16 blocks", every, "BF16", 256, 256, 1, 16)
    compare("every F16 pattern, [512, 128] in 32x32 blocks", every, "F16", 512, 128, 32, 32)
    print("fp8 reference: all agree")


if __name__ == "__main__":
    main()
