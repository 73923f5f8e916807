"""Run by Python at the start of every process whose path holds tests/ (the
tests' children and the tools' measured processes: pytest's and the
harness's PYTHONPATH; tests/conftest.py imports it in pytest's own).

torchvision, installed with timm by the test extra, raises at import beside
torch's CPU build, and transformers imports it wherever it is installed:
zoo/torchvision_ops.py lets it import (nothing heavy is imported here)."""

try:
    from zoo import torchvision_ops
except ImportError:  # the repository root is not on this process's path
    pass
else:
    torchvision_ops.install()
