"""Everything fxguard knows about torch.

- ``facts``: what the installed torch is (layout, config per thread), detected once;
- ``rows``: every row fxguard plans, in order, from the feature modules that own them;
- ``prepare``: the rows that apply to this torch, turned into changes;
- ``config``: torch config per thread (snapshots, following threads and backward).
"""
