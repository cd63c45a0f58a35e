"""The core never imports PyTorch, even where it is installed (SPEC: torch is optional).

tests/no_torch.py, run by ``make test``, checks the converse: qkern works
where torch cannot be imported.
"""

import subprocess
import sys


def test_import_qkern_does_not_import_torch():
    code = ("import sys, numpy as np, qkern, qkern.bench, qkern.__main__\n"
            "qkern.WoqLinear(np.ones((2, 3), np.int8), np.ones(2, np.float32))"
            "(np.ones(3, np.float32))\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
