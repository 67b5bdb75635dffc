#!/usr/bin/env python3
"""Writes a copy of a GGUF file whose quantized tensors under the given name prefixes are F32.

The values are the `gguf` package's dequantizers' (exact: every quantized value is a product of
small integers and f16 scales, which f32 holds), the metadata and the other tensors are copied as
they are. `cargo xtask test` uses it to make gemma-3-270m with F32 layer weights: on such a file
no matrix product rounds its input rows to 8 bits, which on the quantized file turns the last-bit
differences of two correct attention orders into cosine gaps near 2e-3.

usage: dequantize_gguf.py IN.gguf OUT.gguf [PREFIX ...]   (default prefix: blk.)
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize


def main():
    src, dst, *prefixes = sys.argv[1:]
    prefixes = prefixes or ["blk."]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    for t in r.tensors:
        qtype = t.tensor_type
        shape = [int(x) for x in reversed(t.shape)]
        plain = qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
        if any(t.name.startswith(p) for p in prefixes) and not plain:
            data = dequantize(t.data, qtype).reshape(shape).astype(np.float32)
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, t.data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
