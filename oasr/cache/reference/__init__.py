"""The specification's reference API: what only tests and the specification's examples use.

``StreamContext`` (one stream's facade over the three managers), dense mode
(``AttentionCacheManager.commit`` / ``get_stacked_cache``) and WeNet's conv-cache
layout (``CnnCacheManager.get_wenet_cache`` / ``update_wenet``). The engine runs none of it: it
drives the managers in paged mode, batched, by slot. The names stay where the specification
writes them (``from oasr.cache import StreamContext``; the methods on the managers).
"""
