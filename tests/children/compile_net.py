"""A user's script in a separate process: torch.compile a small model
(``zoo/compile_models.py``'s Net or Net2) with
backend="ltc_cache" under whatever LTC_CACHE_* the test set, and check it
against eager.

Prints one JSON object: the process's stats, whether the outputs matched,
and every warning (message, file, line) the run gave. ``--init-ts`` first
initialises LTC's TorchScript backend as LTC's own users do; ``--extract``
goes through ltc_cache.extract_compiled_graph instead of torch.compile;
``--options JSON`` and ``--mode M`` are passed to torch.compile.
"""

from __future__ import annotations

import argparse
import json
import warnings

import torch
from torch import fx

import ltc_cache
from zoo.compile_models import Net, Net2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("Net", "Net2"), default="Net")
    parser.add_argument("--init-ts", action="store_true")
    parser.add_argument("--extract", action="store_true")
    parser.add_argument("--options")
    parser.add_argument("--mode")
    args = parser.parse_args()
    if args.init_ts:
        import torch._lazy.ts_backend as ts_backend

        ts_backend.init()
    torch.manual_seed(0)
    model = {"Net": Net, "Net2": Net2}[args.model]().eval()
    x = torch.randn(3, 8)
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if args.extract:
                compiled = ltc_cache.extract_compiled_graph(fx.symbolic_trace(model), [x])
                out = compiled(x)[0]
            else:
                kwargs = {}
                if args.options:
                    kwargs["options"] = json.loads(args.options)
                if args.mode:
                    kwargs["mode"] = args.mode
                with torch.no_grad():
                    out = torch.compile(model, backend="ltc_cache", **kwargs)(x)
            matched = bool(torch.allclose(out, model(x), atol=1e-6))
        except Exception as exc:
            matched, error = False, f"{type(exc).__name__}: {exc}"
    print(json.dumps({
        "stats": ltc_cache.stats(),
        "matched": matched,
        "error": error,
        "warnings": [{"message": str(w.message), "file": w.filename, "line": w.lineno}
                     for w in caught if issubclass(w.category, RuntimeWarning)],
    }))


if __name__ == "__main__":
    main()
