"""A child process for tests/program/test_trainer.py: runs examples/trainer.py (a
transformers ``Trainer``, or the hand-written loop) with AOTAutograd's graph
captures counted here (tools/probes.py's wrapper) and ltc_cache's
warnings collected.

``python tests/children/trainer.py [examples/trainer.py's arguments]`` prints
the example's JSON line with ``aot`` (AOTAutograd traces, counted apart from
ltc_cache's counters) and ``warnings`` added.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings

from tools.harness import ROOT
from tools.probes import AOT, count_aot_traces


def main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location(
        "trainer_example", ROOT / "examples" / "trainer.py")
    example = importlib.util.module_from_spec(spec)
    # Importable by name, as a script's classes are: programs pickle them so.
    sys.modules["trainer_example"] = example
    spec.loader.exec_module(example)
    count_aot_traces()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = example.run(example.parser().parse_args(argv))
    result["aot"] = AOT["traces"]
    result["warnings"] = [str(w.message) for w in caught if "ltc_cache" in str(w.message)]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
