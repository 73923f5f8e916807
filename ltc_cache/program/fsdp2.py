"""What the stand-in and :mod:`ltc_cache.program.fully_sharded` read of
FSDP2 (``fully_shard``): its module class, where this torch has one, and
the stand-in's refusal to be sharded itself
(docs/torch/distributed.md#sharding-the-stand-in-fails)."""

from __future__ import annotations

from ..errors import WrongType

__all__ = ["fsdp_module_class", "refuse_sharding_the_stand_in"]


def fsdp_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return None
    return FSDPModule


def refuse_sharding_the_stand_in(cls: type) -> None:
    """``fully_shard(ltc_cache.compile(model))`` made the stand-in an FSDP
    root whose first forward fails inside FSDP's hook
    (docs/torch/distributed.md#sharding-the-stand-in-fails): refused where ``fully_shard`` sets its
    class, its last step, with the order that works."""
    fsdp = fsdp_module_class()
    if fsdp is not None and isinstance(cls, type) and issubclass(cls, fsdp):
        raise WrongType(
            "fully_shard(ltc_cache.compile(model)) is not supported: FSDP2 must shard the "
            "model itself. Call fully_shard on the blocks and on the model first, then "
            "ltc_cache.compile(model) (docs/recipes.md, FSDP2)")
