"""What ``ltc-cache`` finds and plans, apart from how it is printed (the cli package).

Scanning gives frozen reports with raw numbers and readable ``*_str``
forms; deleting is a plan whose ``expected_freed_size`` is shown before it
runs. An entry that cannot be read becomes a row with a ``problem``, never
an abort.

- listing.py: ``scan`` into EntryInfo rows (``ls``)
- stats.py: totals and every process's counters (``stats``)
- selection.py: ``--filter``, ``--sort``, key prefixes
- show_and_verify.py: reading whole entries (``show``, ``verify``), each
  kind's part of them by its registration (entries/kind_registry.py)
- deletion.py: deletion plans (``prune``, ``clear``)
- bundles.py: ``export`` and ``import``
- fused.py: ``fuse``
- remote.py: the Redis tier, shaped for the same reports

Only show_and_verify.py (and the kinds' handlers it calls), deletion.py
(``--stale``), bundles.py and fused.py import torch, and only inside the
calls that decode entries, compile or need torch's version, so ``ls`` and
``stats`` never do.
"""

from ..compile_backend import plan_kind
from ..graph import graph_kind
from ..graph.fused import fused_kind
from ..graph.fused.fused_kind import FusedInfo, check_fused, fused_info, signature_str
from ..program import program_kind
from .bundles import ImportReport, export_bundle, import_bundle
from .deletion import DeletePlan, plan_clear, plan_prune, remove_free_lock_files
from .fused import FuseOutcome, FuseTarget, fuse_one, plan_fuse
from .listing import CacheReport, EntryInfo, scan
from .selection import SORT_FIELDS, EntryFilter, parse_filter, resolve_key, sort_entries
from .show_and_verify import (
    EntryProblem,
    Progress,
    VerifyReport,
    describe_source,
    kind_view,
    load_entry,
    verify,
)
from .stats import STAT_LABELS, STAT_NAMES, KindTotal, StatsReport, collect_stats

# Every kind's registration (entries/kind_registry.py), made as each is
# imported: whatever reads a cache knows every kind.
KIND_REGISTRATIONS = (graph_kind, fused_kind, plan_kind, program_kind)

__all__ = [
    "SORT_FIELDS",
    "STAT_LABELS",
    "STAT_NAMES",
    "CacheReport",
    "DeletePlan",
    "EntryFilter",
    "EntryInfo",
    "EntryProblem",
    "FuseOutcome",
    "FuseTarget",
    "FusedInfo",
    "ImportReport",
    "KindTotal",
    "Progress",
    "StatsReport",
    "VerifyReport",
    "check_fused",
    "collect_stats",
    "describe_source",
    "export_bundle",
    "fuse_one",
    "fused_info",
    "import_bundle",
    "kind_view",
    "load_entry",
    "parse_filter",
    "plan_clear",
    "plan_fuse",
    "plan_prune",
    "remove_free_lock_files",
    "resolve_key",
    "scan",
    "signature_str",
    "sort_entries",
    "verify",
]
