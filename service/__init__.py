"""dbf-serve's HTTP service: evidential heads run per request, fused with :mod:`fusion`.

It imports :mod:`fusion`, never ``training`` or torch.
"""
