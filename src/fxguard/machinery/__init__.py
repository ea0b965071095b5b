"""fxguard's machinery: how a library's state is made per thread.  Knows no torch names.

What a change is, and applying it:
- ``changes``: what a change is, and what install() says about each row (Outcome, Row);
- ``originals``: the one record of what was there before, so undo is exact;
- ``settle``: which frames (on stacks, or suspended generators) can still use a name a change removes;
- ``codegen``: new code for a function that keeps its identity (the one code swap);
- ``rewrite``: a function recompiled from its own source with chosen globals redirected;
- ``code_cache``: rewrite's (and writers') results kept on disk, like .pyc files;
- ``writers``: who in a package assigns a module global as an attribute;
- ``import_watch``: rows planned without importing, applied when their module is imported;
- ``process_hooks``: the hooks set on the process (in a forked child, around imports, at exit), once each.

Kinds of rows (each a ``changes.RowKind``: one file, one kind):
- ``per_thread_globals``: module globals served per thread from the C core's records;
- ``per_thread_attrs``: class and instance attributes served per thread;
- ``per_thread_patching``: "patch this for my trace" made to patch only the calling thread;
- ``wrapped``: a function whose code runs a body around the original (a lock, a window);
- ``config_default``: a config entry's default changed for every thread;
- ``once``, ``shared_window``, ``exact_counters``: below.
- ``overlay``: writes inside a window stay in the writing thread (used by wrapped rows).

Concurrency primitives:
- ``compile_gate``: one compile per code object at a time, its result for those who waited;
- ``shared_lock``: a lock some holders hold shared (concurrent compiles);
- ``shared_window``: one process-wide window for overlapping users (anomaly mode);
- ``once``: one-time set-up run once, whoever calls first;
- ``exact_counters``: counters that stay exact under threads.
"""
