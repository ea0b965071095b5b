"""fxguard's machinery: how a library's state is made per thread.  Knows no torch names.

- ``changes``: what a change is, and what install() says about each row (Outcome, Row);
- ``originals``: the one record of what was there before, so undo is exact;
- ``codegen``: new code for a function that keeps its identity (the one code swap);
- ``rewrite``: a function recompiled from its own source with chosen globals redirected;
- ``code_cache``: rewrite's results kept on disk, like .pyc files;
- ``per_thread_globals``: module globals served per thread from the C core's records;
- ``per_thread_patching``: "patch this for my trace" made to patch only the calling thread;
- ``overlay``: writes inside a window stay in the writing thread.
"""
