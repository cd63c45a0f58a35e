"""Run as a script (``make test`` does): qkern works where PyTorch cannot be imported.

``sys.modules["torch"] = None`` makes every ``import torch`` fail as if
torch were not installed. With that: the NumPy API, ``python -m qkern info``,
and ``import qkern.torch`` failing with an ImportError that names the extra.
"""

import contextlib
import io
import sys


def main() -> None:
    sys.modules["torch"] = None
    import numpy as np

    import qkern
    import qkern.__main__

    y = qkern.weight_int8pack_mm(np.ones((1, 3), np.float32), np.ones((2, 3), np.int8),
                                 np.full(2, 0.5, np.float32))
    assert y.tolist() == [[1.5, 1.5]], y
    with contextlib.redirect_stdout(io.StringIO()) as text:
        assert qkern.__main__.main(["info"]) == 0
    assert "Kernels:" in text.getvalue()
    try:
        import qkern.torch  # noqa: F401
    except ImportError as exc:
        assert "pip install 'qkern[torch]'" in str(exc), exc
    else:
        raise AssertionError("import qkern.torch worked with torch blocked")
    print("ok: qkern imports and runs with PyTorch blocked")


if __name__ == "__main__":
    main()
