"""Integers that follow a lane's context are left unspecialized in the kernels that take them.

Triton compiles a kernel anew for an integer argument divisible by 16 or not (and for 1): where such an
integer follows a lane's context (a block count, the row stride of a tensor sized by it, the rows of a
step), a request of a length the warm-up never met compiles a variant while serving. On the H200 the
Flash Next demo did so twice in block_choice._choose; these are the arguments of that kind. So does a
pointer's 16-byte alignment where it points at a row of a packed tensor (the draw's per-row fields: the
H100's demo compiled two variants of sampling._slice_best while serving). Read from the
compiled form's parameters (the interpreter keeps none), in a process without TRITON_INTERPRET.
"""

from __future__ import annotations

import json
import subprocess
import sys

from support import clean_environ

FOLLOW_THE_CONTEXT = {
    "block_choice._choose": {"blocks", "stride_s", "stride_o"},
    "block_choice._choose_long": {"stride_s", "stride_o"},
    "block_scores._scores": {"blocks", "stride_or"},
    "gemm._spread": {"m", "stride_ps"},
    "gemm._whole": {"m", "m_tiles"},
    "gdn_chunk._chunks": {"lanes", "rows_all"},
    "gdn_prefill._scan": {"rows_all"},
    "gdn_prefill._output": {"lanes"},
    "paged_prefill._prefill_tile": {"max_keys", "spans", "stride_tb", "stride_ps"},
    "paged_prefill._prefill_merge": {"max_keys", "stride_ps"},
    "step_inputs._gather": {"stride_f", "pages"},
}
# pointers to a row of a packed tensor ([fields, rows]: the second row is 16-byte aligned as rows are even)
UNALIGNED = {
    "sampling._slice_best": {"temperature", "seeds", "positions"},
    "sampling._row_best": {"out", "out_rows"},
}
READ = """
import importlib, json, sys
found = {}
for name in json.loads(sys.argv[1]):
    module, kernel = name.split(".")
    fn = getattr(importlib.import_module("tfd_kernels." + module), kernel)
    params = fn.params
    found[name] = {"params": [p.name for p in params],
                   "unspecialized": [p.name for p in params if p.do_not_specialize],
                   "unaligned": [p.name for p in params if p.do_not_specialize_on_alignment]}
print(json.dumps(found))
"""


def test_a_context_length_compiles_no_new_variant() -> None:
    environ = {k: v for k, v in clean_environ().items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", READ, json.dumps(sorted({*FOLLOW_THE_CONTEXT, *UNALIGNED}))],
                          env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for kind, wanted in (("unspecialized", FOLLOW_THE_CONTEXT), ("unaligned", UNALIGNED)):
        for name, names in wanted.items():
            assert names <= set(found[name]["params"]), name  # the names are the kernel's own
            assert names <= set(found[name][kind]), (kind, name)
