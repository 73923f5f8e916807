"""A child process for tests/compile_backend/test_suite_warm.py: the first
training call of each model named (``python -m tools.bench.suite --child
MODEL train``: through ``ltc_cache.compile``, against eager on a copy), one model
after the other, each counted on its own as a process of its own counts
it: ltc_cache's counters, AOTAutograd's traces, Dynamo's frames.

``python tests/children/suite.py MODEL [MODEL ...]`` prints one JSON line:
model -> tools.bench.suite's report.
"""

from __future__ import annotations

import json
import sys

from ltc_cache.diagnostics import counters
from tools.bench import suite_child
from tools.probes import AOT


def main(names: list[str]) -> int:
    results = {}
    for name in names:
        AOT["traces"] = 0
        counters.reset()
        if "torch._dynamo" in sys.modules:  # as the models before it left them
            sys.modules["torch._dynamo"].utils.counters.clear()
        results[name] = suite_child.child(name, "train")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
