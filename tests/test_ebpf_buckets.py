"""The BPF program's bucket function is proto/buckets.py's scheme, bit for bit.

The block between HT_BUCKET_BEGIN/END in collector/ebpf_program.c is plain C: we compile it with
gcc in user space (no eBPF needed) and compare it with bucket_of_ns on edge and random values.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
from conftest import missing_prerequisite

from hypertrace.collector.ebpf import PROGRAM_PATH
from hypertrace.proto import buckets


def test_bpf_bucket_code_matches_python_scheme(tmp_path):
    if shutil.which("gcc") is None:
        missing_prerequisite("gcc not found (apt-get install gcc)")
    text = PROGRAM_PATH.read_text()
    block = re.search(r"// HT_BUCKET_BEGIN.*?\n(.*)// HT_BUCKET_END", text, re.S).group(1)
    consts = "\n".join(f"#define HT_{n} {v}" for n, v in (
        ("NUM_BUCKETS", buckets.NUM_BUCKETS), ("MIN_EXP", buckets.MIN_EXP),
        ("MAX_EXP", buckets.MAX_EXP), ("SUB_BITS", buckets.SUB_BUCKET_BITS)))
    src = tmp_path / "b.c"
    src.write_text("#include <stdio.h>\n#include <stdint.h>\ntypedef uint32_t u32; typedef uint64_t u64;\n"
                   "#define __always_inline inline __attribute__((always_inline))\n" + consts + "\n"
                   + block + "\nint main(void){unsigned long long v; while(scanf(\"%llu\",&v)==1)"
                   " printf(\"%u\\n\", ht_bucket(v)); return 0;}\n")
    exe = tmp_path / "b"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    rng = np.random.default_rng(1)
    edges = np.concatenate([buckets.LOWER_NS[1:], buckets.UPPER_NS[:-1]]).astype(np.uint64)
    values = np.unique(np.concatenate([
        np.arange(0, 4096, dtype=np.uint64), edges, edges - 1, edges + 1,
        rng.integers(0, 2 ** 40, 20000, dtype=np.uint64),
        (10 ** rng.uniform(2, 11, 20000)).astype(np.uint64), np.array([2 ** 63], dtype=np.uint64)]))
    out = subprocess.run([str(exe)], input="\n".join(map(str, values.tolist())), text=True,
                         capture_output=True, check=True).stdout.split()
    np.testing.assert_array_equal(np.array(out, dtype=np.int64),
                                  buckets.bucket_of_ns(values.astype(np.float64)))
