"""What every product's entries stand on, over the byte-level store.

An entry (`entry`: the :class:`~.entry.Entry`, its body to and from bytes;
`layout`: its inputs' and outputs' sources) in its envelope (`wire`: the
bytes as far as they can be read without torch, and internal records), of
one kind (`kinds`), handled by the registration its product declares
(`kind_registry`), under a key hashed from named parts (`keys`), kept by an
:class:`~.entry_cache.EntryCache` (`entry_cache`: look up, store, drop,
count, one maker of a key at a time), with a hint of why a key missed
(`miss_reasons`). The graph, plan, program and fused products build on
these; nothing here names a product.
"""
