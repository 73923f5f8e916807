"""Layer 1, one graph made persistent: `extract_compiled_graph` of a whole FX graph.

A graph's key (`graph_keys`), the LTC trace (`extract`; LTC's private
bindings are `lazy_bindings`'s alone), the IR rewrites (`rewrites`), the
replay (`replay`), the graph and negative kinds' registration
(`graph_kind`), and the cache that ties them to the entries
(`cache`: a GraphCache is an `ltc_cache.entries` EntryCache). The entry, its
layout, generic keys and miss reports are `ltc_cache.entries`'. Nothing here
knows about Dynamo or AOTAutograd.
"""
