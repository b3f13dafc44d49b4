"""GPU kernels used to measure the mechanism behind claim C1 (L2 reuse of shared KV blocks).

Nothing is imported here: the kernels need torch (and triton), which the rest of the package
does not; import `feather.kernels.paged_decode` explicitly.
"""
