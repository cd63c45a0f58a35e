"""Doctest collection (``pytest --doctest-modules qkern tests``) without PyTorch.

The paths below (the package qkern.torch, a test helper) import torch; where
it is not installed they are not collected (the test files that need torch
skip themselves, with the reason).
"""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("torch") else ["qkern/torch",
                                                                "tests/torch_support.py"]
