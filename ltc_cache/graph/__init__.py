"""Layer 1, one graph made persistent: `extract_compiled_graph` of a whole FX graph.

Keys (`keys`), the LTC trace (`extract`; LTC's private bindings are
`lazy_bindings`'s alone), the IR rewrites (`rewrites`), the
stored entry and its layout (`entry`, `layout`), the replay (`replay`), and
the cache that ties them to a store (`cache`, `names`). Nothing here knows
about Dynamo or AOTAutograd.
"""
