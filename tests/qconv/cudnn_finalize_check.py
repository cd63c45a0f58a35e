"""Child process of test_cudnn_descriptors.py: finalize every graph variant.

Builds, with the real libcudnn and no GPU, the QConvGraph of every
combination of form (virtual, in-place), bias, ReLU and per-channel scale
for several geometries, and prints one JSON object: the loaded library, its
version, and per variant the (role, kind, finalized) of every descriptor or
the CudnnError raised.  Heuristics are not run: without a GPU and cuBLASLt
cuDNN aborts the process there.
"""

import itertools
import json
import sys

from qkern.cudnn._graph import QConvGraph

from qkern._conv_spec import geometry
from qkern.cudnn import CudnnError, _api, _loader
from qkern.cudnn._conv import graph_spec

GEOMETRIES = {
    "3x3 pad1": ((2, 8, 8, 16), (32, 3, 3, 16), dict(padding=1)),
    "1x1": ((1, 5, 5, 8), (4, 1, 1, 8), {}),
    "7x7 stride2, C=3 O=5 padded": ((1, 16, 16, 3), (5, 7, 7, 3), dict(stride=2, padding=3)),
    "dilated asymmetric pad": ((1, 9, 11, 4), (8, 3, 3, 4),
                               dict(dilation=(2, 1), padding=((2, 1), (0, 1)), stride=(1, 2))),
    "grouped 2, Cg=3 Og=2 padded": ((1, 6, 6, 6), (4, 3, 3, 3), dict(groups=2, padding=1)),
    "depthwise 8": ((1, 6, 6, 8), (8, 3, 3, 1), dict(groups=8, padding=1)),
    "output 1x1": ((3, 7, 7, 4), (4, 7, 7, 4), {}),
}


def main():
    path = _loader.ensure_loaded()
    report = {"library": path, "version": _api.version(), "variants": {}}
    for name, (xs, ws, params) in GEOMETRIES.items():
        g = geometry(xs, ws, **params)
        for form, bias, relu, per_channel in itertools.product(
                ("virtual", "inplace"), (False, True), (False, True), (False, True)):
            spec = graph_spec(g, bias=bias, relu=relu, per_channel=per_channel)
            key = f"{name} | {form} bias={bias} relu={relu} per_channel={per_channel}"
            try:
                graph = QConvGraph(spec, form)
                report["variants"][key] = {"descriptors": graph.descriptors}
                graph.destroy()
            except CudnnError as e:
                report["variants"][key] = {"error": str(e)}
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
