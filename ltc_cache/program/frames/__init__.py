"""Programs of several frames: a function Dynamo compiles with graph breaks.

Dynamo's AOT precompile (the single-graph route, :mod:`ltc_cache.program.single_graph`)
takes one graph only. A function with a graph break is compiled as several
frames: the function itself, cut at the break, and one *resume function* for
the rest, each with its own graph and guards (and so on for each break).
torch 2.13 records those in a ``CompilePackage`` when one is handed to
``torch._dynamo.optimize``: every frame's original code, its transformed
bytecode and guards, the resume functions' code, and the backend of each
graph. ``CompilePackage.install`` puts them back, in a later process, as
*precompile entries* on each code object, which the eval-frame hook checks
before it would capture. So a warm process captures nothing, and a frame
whose entries do not fit (a new shape, a failing check) is captured again
alone, by Dynamo, as any recompile.

This package keeps what ``ltc_cache.compile`` promises of a program:

- the sources of every function Dynamo traced in any frame are recorded
  (:func:`ltc_cache.program.describe.code_record`) and compared on load,
  instead of Dynamo's own record (whole module texts it never compares):
  :mod:`.package`;
- guards Dynamo cannot save become portable checks per frame, added to that
  frame's guard manager (live in the capturing process, and on install in a
  later one) as one lambda guard that resolves them on its first call:
  :mod:`.portable_checks`;
- the artifact (the package's state and every frame's graph) is signed with
  the program's key and unpickled only once the signature holds:
  :mod:`.stored`;
- names the package installs in module globals (resume functions, Dynamo's
  builtins dict) are kept clear of Dynamo's later captures in the process
  (:func:`.names.advance_unique_ids`): torch 2.13 names them from a
  process-wide counter, and a recompile after a load would otherwise reuse
  one and fail (``Name '__builtins_dict___0' already exists in scope``).

:mod:`.recording` records what Dynamo does during each call through the
frames, :mod:`.program` holds one function's frames, and :mod:`.frames_route` is
the route that runs a function through them. Every private piece of torch
used here goes through :mod:`ltc_cache.dynamo_package`.
"""

from .frames_route import FramesRoute, breaks_the_graph

__all__ = ["FramesRoute", "breaks_the_graph"]
