"""The fused tier: each stored graph also compiled ahead of time by
AOTInductor into a shared library, signed, stored beside the graph's entry
and loaded through torch's C++ runner in place of its TorchScript function
where it is faster (docs/how-it-works.md, "Fused libraries")."""
