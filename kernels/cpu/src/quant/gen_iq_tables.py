#!/usr/bin/env python3
"""Writes iq_tables.rs: the i-quant grid and sign tables, taken from the gguf package (format data).

Run from the repository root:
    /work/venv-dev/py/bin/python kernels/cpu/src/quant/gen_iq_tables.py > kernels/cpu/src/quant/iq_tables.rs
"""
import importlib.metadata

import numpy as np
from gguf import quants


def grid_bytes(cls):
    cls.init_grid()
    g = cls.grid.reshape(cls.grid_shape)
    assert np.all(g == np.round(g))
    return g.astype(np.int64)


def words(g):
    """Packs each grid row (4 or 8 bytes, element 0 in the low byte) into one little-endian word."""
    out = []
    for row in g:
        w = 0
        for i, v in enumerate(row):
            w |= (int(v) & 0xFF) << (8 * i)
        out.append(w)
    return out


def emit(name, doc, ty, width, vals):
    print(f"/// {doc}")
    print(f"pub static {name}: [{ty}; {len(vals)}] = [")
    per = 4 if width == 16 else 6
    for i in range(0, len(vals), per):
        print("    " + " ".join(f"0x{v:0{width}x}," for v in vals[i:i + per]))
    print("];")
    print()


print("//! I-quant lattice grids and sign tables (format data), generated from the gguf Python package")
print(f"//! {importlib.metadata.version('gguf')} with numpy {np.__version__}; do not edit by hand. Regenerate with:")
print("//! `/work/venv-dev/py/bin/python kernels/cpu/src/quant/gen_iq_tables.py > kernels/cpu/src/quant/iq_tables.rs`")
print("//!")
print("//! Each grid row is one little-endian word: element 0 is the low byte. Values are the magnitudes")
print("//! ggml stores (IQ2: 8, 25, 43; IQ3: small odd/even integers) or, for IQ1, the signed bytes -1, 0, 1.")
print()
print("// Formatted by the generator; mod.rs marks this module `#[rustfmt::skip]`.")
print()
emit("IQ2XXS_GRID", "IQ2_XXS grid: 256 rows of 8 magnitudes.", "u64", 16, words(grid_bytes(quants.IQ2_XXS)))
emit("IQ2XS_GRID", "IQ2_XS grid: 512 rows of 8 magnitudes.", "u64", 16, words(grid_bytes(quants.IQ2_XS)))
emit("IQ2S_GRID", "IQ2_S grid: 1024 rows of 8 magnitudes.", "u64", 16, words(grid_bytes(quants.IQ2_S)))
emit("IQ3XXS_GRID", "IQ3_XXS grid: 256 rows of 4 magnitudes.", "u32", 8, words(grid_bytes(quants.IQ3_XXS)))
emit("IQ3S_GRID", "IQ3_S grid: 512 rows of 4 magnitudes.", "u32", 8, words(grid_bytes(quants.IQ3_S)))
emit("IQ1S_GRID", "IQ1_S/IQ1_M grid: 2048 rows of 8 signed bytes in {-1, 0, 1}.", "u64", 16, words(grid_bytes(quants.IQ1_S)))
ks = list(quants.IQ2_XXS.ksigns)
print("/// Sign patterns: entry `i` has the 7 bits of `i` and an eighth bit making the count of set bits even.")
print(f"pub static KSIGNS: [u8; {len(ks)}] = [")
for i in range(0, len(ks), 16):
    print("    " + " ".join(f"0x{v:02x}," for v in ks[i:i + 16]))
print("];")
print()
kv = quants.IQ4_NL.kvalues
print("/// IQ4_NL/IQ4_XS non-linear 4-bit values.")
print(f"pub static KVALUES_IQ4NL: [i8; 16] = [{', '.join(str(v) for v in kv)}];")
print()
mx = quants.MXFP4.kvalues
assert tuple(mx) == tuple(quants.NVFP4.kvalues)
print("/// E2M1 (FP4) values, doubled so that they are integers; shared by MXFP4 and NVFP4.")
print(f"pub static KVALUES_E2M1: [i8; 16] = [{', '.join(str(v) for v in mx)}];")
